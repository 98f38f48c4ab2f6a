#!/usr/bin/env node
// Conformance adapter for the JS SDK (clients/js, its built dist/). It follows the contract in
// clients/conformance/README.md: commands as JSON lines on stdin, events as JSON lines on stdout.
// It only translates: every decision (reconnect, backoff, recovery, refresh) is the SDK's own.
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { dirname, resolve } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
const sdkPath = process.env.HERALD_JS_SDK ?? resolve(here, '../../../js/dist/index.node.mjs');
const { Herald, Backoff } = await import(sdkPath);

// Self-test only (driver/selftest.mjs): break the SDK on purpose to prove the suite notices.
const mutant = process.env.CONFORMANCE_MUTANT;
if (mutant === 'ignore-after-ms') {
  const next = Backoff.prototype.next;
  Backoff.prototype.next = function () {
    return next.call(this, 0);
  };
} else if (mutant === 'no-backoff') {
  Backoff.prototype.next = () => 0;
}

const t0 = Date.now();
function out(event) {
  process.stdout.write(`${JSON.stringify({ t: Date.now() - t0, ...event })}\n`);
}

let client;
const subs = new Map();
let tokens = [];
let tokenIndex = 0;

function errorBody(e) {
  return { code: typeof e?.code === 'number' ? e.code : -1, message: String(e?.message ?? e) };
}

function subscribeChannel(channel, args) {
  const opts = {};
  if (args.since) opts.since = args.since;
  if (args.tf) opts.tagsFilter = args.tf;
  if (args.delta) opts.delta = args.delta;
  const sub = client.subscribe(channel, opts);
  subs.set(channel, sub);
  sub.on('subscribed', (ctx) =>
    out({ event: 'subscribed', channel, server_side: false, epoch: ctx.epoch, offset: ctx.offset, recovered: ctx.recovered === true, resubscribed: ctx.resubscribed }),
  );
  sub.on('publication', (p) =>
    out({ event: 'publication', channel, offset: p.offset, epoch: sub.position?.epoch, data: p.data, tags: p.tags }),
  );
  sub.on('recoveryFailed', (ctx) => out({ event: 'recovery_failed', channel, since: ctx.since }));
  sub.on('unsubscribed', (ctx) => {
    subs.delete(channel);
    out({ event: 'unsubscribed', channel, code: ctx.code });
  });
  sub.on('join', (ctx) => out({ event: 'join', channel, user: ctx.info?.user }));
  sub.on('leave', (ctx) => out({ event: 'leave', channel, user: ctx.info?.user }));
  sub.on('error', (ctx) => out({ event: 'error', type: 'subscribe', channel, code: errorBody(ctx.error).code }));
}

function makeClient(args) {
  tokens = args.tokens ?? [];
  tokenIndex = 0;
  const opts = {
    minReconnectDelayMs: args.min_reconnect_delay_ms,
    maxReconnectDelayMs: args.max_reconnect_delay_ms,
    timeoutMs: args.timeout_ms,
    pingGraceMs: args.ping_grace_ms,
    transport: 'websocket',
  };
  if (args.token !== undefined) opts.token = args.token;
  if (tokens.length > 0) {
    opts.getToken = () => {
      const i = Math.min(tokenIndex, tokens.length - 1);
      tokenIndex++;
      out({ event: 'token_requested', index: i });
      return tokens[i];
    };
  }
  const c = new Herald(args.url, opts);
  c.on('connecting', (ctx) => {
    // code 0: connect() was called; anything else: the connection was lost and it will retry.
    if (ctx.code !== 0) out({ event: 'disconnected', code: ctx.code, reconnect: true });
  });
  c.on('disconnected', (ctx) => out({ event: 'disconnected', code: ctx.code, reconnect: false }));
  c.on('connected', (ctx) => out({ event: 'connected', client: ctx.client }));
  c.on('error', (ctx) => out({ event: 'error', type: ctx.type, code: errorBody(ctx.error).code, ...(ctx.channel ? { channel: ctx.channel } : {}) }));
  c.on('subscribed', (ctx) => {
    // Server-side subscriptions have no recoveryFailed event: `recovered: false` (present, not
    // absent) is how the SDK says the recovery it asked for failed.
    if (ctx.recovered === false) out({ event: 'recovery_failed', channel: ctx.channel });
    out({ event: 'subscribed', channel: ctx.channel, server_side: true, epoch: ctx.epoch, offset: ctx.offset, recovered: ctx.recovered === true });
  });
  c.on('publication', (p) => out({ event: 'publication', channel: p.channel, offset: p.offset, data: p.data, tags: p.tags }));
  c.on('unsubscribed', (ctx) => out({ event: 'unsubscribed', channel: ctx.channel, code: ctx.code }));
  return c;
}

async function run(cmd) {
  const a = cmd.args ?? {};
  switch (cmd.cmd) {
    case 'connect':
      if (!client) client = makeClient(a);
      client.connect();
      return {};
    case 'subscribe':
      subscribeChannel(a.channel, a);
      return {};
    case 'unsubscribe':
      subs.get(a.channel)?.unsubscribe();
      return {};
    case 'publish':
      return await client.publish(a.channel, a.data);
    case 'history':
      return await client.history(a.channel, { since: a.since, limit: a.limit });
    case 'presence':
      return await client.presence(a.channel);
    case 'rpc':
      return { data: await client.rpc(a.method, a.data) };
    case 'disconnect':
      client.disconnect();
      return {};
    case 'exit':
      client?.disconnect();
      out({ event: 'result', id: cmd.id, ok: true, result: {} });
      process.exit(0);
      break;
    default:
      throw Object.assign(new Error(`unknown command ${cmd.cmd}`), { code: -2 });
  }
}

const rl = createInterface({ input: process.stdin });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch {
    out({ event: 'result', id: null, ok: false, error: { code: -3, message: 'bad JSON' } });
    return;
  }
  Promise.resolve()
    .then(() => run(cmd))
    .then(
      (result) => out({ event: 'result', id: cmd.id, ok: true, result: result ?? {} }),
      (e) => out({ event: 'result', id: cmd.id, ok: false, error: errorBody(e) }),
    );
});
rl.on('close', () => {
  client?.disconnect();
  process.exit(0);
});
out({ event: 'ready', sdk: 'js' });
