#!/usr/bin/env node
// Herald cross-SDK conformance driver. Node's standard library only (no npm packages).
//
//   node driver/driver.mjs --adapter "<command>" [--herald PATH] [--nodes N] [--only NAME] [scenarios/*.json ...]
//
// For each scenario: start the real herald (`serve --dev` on a free port, the scenario's env), a
// TCP proxy in front of it that the driver controls (refuse/reset, delay), the SDK's adapter
// (commands on its stdin, events on its stdout, README.md), run the scenario's steps in order,
// then check the merged event log (adapter events + what the driver and proxy saw) against the
// scenario's expectations. One line per scenario; exit status 1 when any scenario failed.
// With --nodes N (N >= 2, or CONFORMANCE_NODES=N): N nodes on one real Redis (redis-server on a
// free port), the proxy sending each new client connection to the next live node and the API
// calls going round-robin over them, so every reconnect lands on another node.
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '..');
const repo = resolve(root, '..', '..');
const API_KEY = 'conformance-key';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// Arguments

function parseArgs(argv) {
  const a = {
    adapter: undefined,
    herald: process.env.HERALD_BIN,
    nodes: Number(process.env.CONFORMANCE_NODES ?? 1),
    only: undefined,
    files: [],
    verbose: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i];
    if (v === '--adapter') a.adapter = argv[++i];
    else if (v === '--herald') a.herald = argv[++i];
    else if (v === '--only') a.only = argv[++i];
    else if (v === '--nodes') a.nodes = Number(argv[++i]);
    else if (v === '--verbose' || v === '-v') a.verbose = true;
    else a.files.push(v);
  }
  if (!a.adapter) throw new Error('--adapter "<command>" is required (e.g. "node adapters/js/adapter.mjs")');
  if (!Number.isInteger(a.nodes) || a.nodes < 1 || a.nodes > 9) throw new Error('--nodes must be 1 to 9');
  a.herald ??= join(repo, 'target', 'debug', 'herald');
  if (!existsSync(a.herald)) throw new Error(`herald binary ${a.herald} missing (cargo build -p herald-server, or HERALD_BIN)`);
  if (a.files.length === 0) {
    const dir = join(root, 'scenarios');
    a.files = readdirSync(dir)
      .filter((f) => f.endsWith('.json'))
      .sort()
      .map((f) => join(dir, f));
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Helpers

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

function jwt(claims, secret) {
  const b = (x) => Buffer.from(x).toString('base64url');
  const head = b(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const body = b(JSON.stringify(claims));
  return `${head}.${body}.${createHmac('sha256', secret).update(`${head}.${body}`).digest('base64url')}`;
}

/** Bounded wait: polls `fn` until truthy; throws `what` after `ms`. */
async function until(fn, what, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

/** Partial deep match with a few operators: $in, $gte, $lte, $any, $absent. */
function matches(value, pattern) {
  if (pattern !== null && typeof pattern === 'object' && !Array.isArray(pattern)) {
    if ('$in' in pattern) return pattern.$in.some((p) => matches(value, p));
    if ('$gte' in pattern || '$lte' in pattern) {
      if (typeof value !== 'number') return false;
      if ('$gte' in pattern && value < pattern.$gte) return false;
      if ('$lte' in pattern && value > pattern.$lte) return false;
      return true;
    }
    if ('$any' in pattern) return value !== undefined;
    if ('$absent' in pattern) return value === undefined;
    if (value === null || typeof value !== 'object' || Array.isArray(value)) return false;
    return Object.entries(pattern).every(([k, p]) => matches(value[k], p));
  }
  if (Array.isArray(pattern)) {
    return Array.isArray(value) && value.length === pattern.length && pattern.every((p, i) => matches(value[i], p));
  }
  return value === pattern;
}

const show = (x) => JSON.stringify(x);

// ---------------------------------------------------------------------------------------------
// The server

class Server {
  constructor(bin, port, env, log) {
    this.bin = bin;
    this.port = port;
    this.env = env;
    this.log = log;
    this.output = [];
  }
  async start() {
    const child = spawn(this.bin, ['serve', '--dev', '--port', String(this.port)], {
      env: { ...process.env, RUST_LOG: 'warn', HERALD_API_KEY: API_KEY, ...this.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    const keep = (d) => {
      this.output.push(d.toString());
      if (this.output.length > 400) this.output.splice(0, 200);
    };
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    this.exited = new Promise((r) => child.once('exit', (code, sig) => r(code ?? sig)));
    let dead = false;
    void this.exited.then(() => (dead = true));
    const deadline = Date.now() + 20_000;
    for (;;) {
      if (dead) throw new Error(`herald exited during start-up:\n${this.output.join('')}`);
      try {
        const r = await fetch(`http://127.0.0.1:${this.port}/health`);
        if (r.status === 200) break;
      } catch {}
      if (Date.now() > deadline) throw new Error('herald did not answer /health within 20 s');
      await sleep(50);
    }
    this.log({ source: 'driver', event: 'server_started', port: this.port });
  }
  async api(path, body) {
    const r = await fetch(`http://127.0.0.1:${this.port}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(5000),
    });
    const text = await r.text();
    if (!r.ok) throw new Error(`${path} ${show(body)} → HTTP ${r.status}: ${text}`);
    return text ? JSON.parse(text) : {};
  }
  running() {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }
  /** SIGTERM (drain) and wait, bounded, for the exit. */
  async stop(signal = 'SIGTERM', ms = 15_000) {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill(signal);
    const timer = setTimeout(() => this.child.kill('SIGKILL'), ms);
    await this.exited;
    clearTimeout(timer);
    this.log({ source: 'driver', event: 'server_stopped', signal, port: this.port });
  }
}

// A real Redis for the nodes of a multi-node run (redis-server from PATH; no persistence).
class Redis {
  async start() {
    this.port = await freePort();
    this.output = [];
    this.child = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child.on('error', (e) => this.output.push(`redis-server: ${e.message} (is redis-server installed?)`));
    this.child.stdout.on('data', (d) => this.output.push(d.toString()));
    this.child.stderr.on('data', (d) => this.output.push(d.toString()));
    this.exited = new Promise((r) => this.child.once('exit', r));
    const deadline = Date.now() + 10_000;
    for (;;) {
      const pong = await new Promise((res) => {
        const c = connect(this.port, '127.0.0.1');
        c.setTimeout(1000, () => c.destroy());
        c.on('error', () => res(false));
        c.on('close', () => res(false));
        c.on('connect', () => c.write('PING\r\n'));
        c.on('data', (d) => {
          res(d.toString().startsWith('+PONG'));
          c.destroy();
        });
      });
      if (pong) return;
      if (this.child.exitCode !== null || Date.now() > deadline)
        throw new Error(`redis-server did not answer PING within 10 s:\n${this.output.join('')}`);
      await sleep(50);
    }
  }
  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }
  async stop() {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill('SIGKILL');
    await this.exited;
  }
}

// The node(s) under test, with Server's interface. One node: exactly the Server. Several: all on
// one Redis; `start` starts every node that is down, `stop` drains the node the client is on
// (the proxy's newest connection) or, at the end, kills them all; API calls go round-robin over
// the live nodes.
class Nodes {
  constructor(bin, n, env, log) {
    this.n = n;
    this.bin = bin;
    this.env = env;
    this.log = log;
    this.nodes = [];
    this.next = 0;
    this.nextApi = 0;
  }
  async start() {
    if (this.nodes.length === 0) {
      let env = this.env;
      if (this.n > 1) {
        this.redis = new Redis();
        await this.redis.start();
        env = { HERALD_BROKER_URL: this.redis.url, ...env }; // a scenario may name another (selftest)
      }
      for (let i = 0; i < this.n; i++) this.nodes.push(new Server(this.bin, await freePort(), env, this.log));
    }
    for (const node of this.nodes) if (!node.running()) await node.start();
  }
  live() {
    const up = this.nodes.filter((node) => node.running());
    if (up.length === 0) throw new Error('no node is running');
    return up;
  }
  /** The port of the node that takes the next client connection (round-robin over live nodes). */
  pick() {
    const up = this.live();
    return up[this.next++ % up.length].port;
  }
  async api(path, body) {
    const up = this.live();
    return up[this.nextApi++ % up.length].api(path, body);
  }
  /** A counter's value summed over the live nodes' `/metrics` (0 where a node lacks it). */
  async metric(name) {
    let sum = 0;
    for (const node of this.live()) {
      const r = await fetch(`http://127.0.0.1:${node.port}/metrics`, { signal: AbortSignal.timeout(5000) });
      if (!r.ok) throw new Error(`GET /metrics on port ${node.port} → HTTP ${r.status}`);
      for (const line of (await r.text()).split('\n')) {
        const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+)/);
        if (m && m[1] === name) sum += Number(m[3]);
      }
    }
    return sum;
  }
  async stop(signal = 'SIGTERM', ms = 15_000, clientPort = undefined) {
    if (signal === 'SIGKILL') {
      for (const node of this.nodes) await node.stop('SIGKILL', ms);
      await this.redis?.stop();
      return;
    }
    const target = this.nodes.find((node) => node.port === clientPort && node.running()) ?? this.live()[0];
    await target.stop(signal, ms);
  }
  get output() {
    return this.nodes.flatMap((node, i) => (this.n > 1 ? [`--- node ${i} (port ${node.port})\n`, ...node.output] : node.output));
  }
}

// ---------------------------------------------------------------------------------------------
// The fault-injecting proxy: every client TCP connection goes through it.
//   up (default): forward both ways; `delay_ms` > 0 holds each chunk that long (order kept).
//   down: reset (RST) every open connection and reset every new one at once, until `up`.
//   blackhole: the open connections stay open but nothing more passes either way (new ones work).
// It logs `proxy_accept` / `proxy_refused` per connection and `disconnect_push` {code, after_ms}
// when it sees a `disconnect` push go to a client (the push is small, so never compressed).

class Proxy {
  /** `target()`: the port to connect a new client connection to. */
  constructor(target, log) {
    this.target = target;
    this.log = log;
    this.down = false;
    this.delayMs = 0;
    this.pairs = new Set();
  }
  async start() {
    this.port = await freePort();
    this.server = createServer((client) => this.accept(client));
    await new Promise((r, j) => {
      this.server.once('error', j);
      this.server.listen(this.port, '127.0.0.1', r);
    });
  }
  accept(client) {
    client.on('error', () => {});
    if (this.down) {
      this.log({ source: 'proxy', event: 'proxy_refused' });
      client.resetAndDestroy();
      return;
    }
    const port = this.target();
    this.log({ source: 'proxy', event: 'proxy_accept', port });
    const upstream = connect(port, '127.0.0.1');
    const pair = { client, upstream, port, holed: false };
    this.pairs.add(pair);
    const drop = () => {
      this.pairs.delete(pair);
      if (!client.destroyed) client.destroy();
      if (!upstream.destroyed) upstream.destroy();
    };
    const forward = (to, d) => {
      if (pair.holed) return;
      if (this.delayMs > 0) setTimeout(() => !to.destroyed && to.write(d), this.delayMs);
      else to.write(d);
    };
    client.on('data', (d) => forward(upstream, d));
    upstream.on('data', (d) => {
      const s = d.toString('latin1');
      const i = s.indexOf('{"disconnect":');
      if (i >= 0) {
        const code = /"code":(\d+)/.exec(s.slice(i));
        const after = /"after_ms":(\d+)/.exec(s.slice(i));
        this.log({
          source: 'proxy',
          event: 'disconnect_push',
          code: code ? Number(code[1]) : undefined,
          after_ms: after ? Number(after[1]) : undefined,
        });
      }
      forward(client, d);
    });
    client.on('close', drop);
    upstream.on('close', drop);
    upstream.on('error', drop);
  }
  setDown() {
    this.down = true;
    for (const p of this.pairs) {
      p.client.resetAndDestroy();
      p.upstream.destroy();
    }
    this.pairs.clear();
  }
  setUp() {
    this.down = false;
  }
  /** The node port of the newest open connection (the client's node), if any. */
  newestPort() {
    return [...this.pairs].at(-1)?.port;
  }
  /** Stop forwarding on the open connections without closing them (a dead path); new ones work. */
  blackhole() {
    for (const p of this.pairs) p.holed = true;
  }
  async close() {
    this.setDown();
    await new Promise((r) => this.server.close(() => r()));
  }
}

// ---------------------------------------------------------------------------------------------
// The application's backend for the server's proxy hooks (docs/proxy.md); "$backend" in
// server.env is its base URL. rpc: method "echo" answers {"data": {"method", "user", "data"}},
// method "refuse" answers error 1403, anything else error 1404.

async function startBackend(log) {
  const port = await freePort();
  const server = createHttpServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      let q = {};
      try {
        q = JSON.parse(body || '{}');
      } catch {}
      log({ source: 'backend', event: 'backend_call', path: req.url, method: q.method });
      let answer;
      if (req.url === '/rpc' && q.method === 'echo') answer = { result: { data: { method: q.method, user: q.user, data: q.data } } };
      else if (req.url === '/rpc' && q.method === 'refuse') answer = { error: { code: 1403, message: 'refused by the test backend' } };
      else answer = { error: { code: 1404, message: `no such hook or method: ${req.url} ${q.method}` } };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(answer));
    });
  });
  await new Promise((r) => server.listen(port, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(() => r())) };
}

// ---------------------------------------------------------------------------------------------
// The adapter process

class Adapter {
  constructor(command, log) {
    this.log = log;
    this.nextId = 1;
    this.stderr = [];
    this.child = spawn(command, { shell: true, stdio: ['pipe', 'pipe', 'pipe'], cwd: root });
    this.child.stderr.on('data', (d) => this.stderr.push(d.toString()));
    this.child.stdin.on('error', () => {});
    this.exited = new Promise((r) => this.child.once('exit', (code) => r(code)));
    this.exitCode = undefined;
    void this.exited.then((c) => (this.exitCode = c));
    createInterface({ input: this.child.stdout }).on('line', (line) => {
      if (!line.trim()) return;
      let ev;
      try {
        ev = JSON.parse(line);
      } catch {
        this.log({ source: 'adapter', event: 'bad_line', line });
        return;
      }
      this.log({ source: 'adapter', ...ev });
    });
  }
  send(cmd, args) {
    const id = this.nextId++;
    this.child.stdin.write(`${JSON.stringify({ id, cmd, args })}\n`);
    return id;
  }
  async stop() {
    if (this.exitCode !== undefined) return;
    try {
      this.send('exit', {});
      this.child.stdin.end();
    } catch {}
    const t = setTimeout(() => this.child.kill('SIGKILL'), 3000);
    await this.exited;
    clearTimeout(t);
  }
}

// ---------------------------------------------------------------------------------------------
// One scenario

async function runScenario(sc, opts) {
  const t0 = Date.now();
  const events = [];
  const log = (ev) => events.push({ at: Date.now() - t0, ...ev });
  const ctx = { events, vars: {}, step: '(setup)' };
  const backend = await startBackend((ev) => events.push({ at: Date.now() - t0, ...ev }));
  const env = Object.fromEntries(
    Object.entries(sc.server?.env ?? {}).map(([k, v]) => [k, String(v).replaceAll('$backend', backend.url)]),
  );
  const secret = env.HERALD_TOKEN_HMAC_SECRET;
  const server = new Nodes(opts.herald, opts.nodes, env, log);
  const proxy = new Proxy(() => server.pick(), log);
  let adapter;

  // Placeholders in step arguments: "$ws" (the proxy's WebSocket URL), "$client" (the client id of
  // the adapter's latest `connected` event), {"$jwt": claims, "exp_in_s"?, "secret"?} (an HS256 token;
  // "exp_in_s" sets exp relative to now).
  const subst = (v) => {
    if (v === '$ws') return `ws://127.0.0.1:${proxy.port}/ws`;
    if (v === '$client') {
      const c = [...events].reverse().find((e) => e.source === 'adapter' && e.event === 'connected');
      if (!c) throw new Error('$client used before any connected event');
      return c.client;
    }
    if (Array.isArray(v)) return v.map(subst);
    if (v && typeof v === 'object') {
      if ('$jwt' in v) {
        const claims = { ...v.$jwt };
        if (typeof v.exp_in_s === 'number') claims.exp = Math.floor(Date.now() / 1000) + v.exp_in_s;
        return jwt(claims, v.secret ?? secret);
      }
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, subst(x)]));
    }
    return v;
  };

  const adapterEvents = (pattern, from = 0) =>
    events.slice(from).filter((e) => e.source !== 'driver-step' && matches(e, pattern));

  async function step(s) {
    switch (s.do) {
      case 'client': {
        const id = adapter.send(s.cmd, subst(s.args ?? {}));
        if (s.await === false) return;
        const res = await until(
          () => events.find((e) => e.source === 'adapter' && e.event === 'result' && e.id === id),
          `the adapter's result of ${s.cmd} #${id}`,
          s.timeout_ms ?? 10_000,
        );
        const want = s.expect ?? { ok: true };
        if (!matches(res, want)) throw new Error(`${s.cmd} result ${show(res)} does not match ${show(want)}`);
        return;
      }
      case 'wait': {
        const n = s.count ?? 1;
        await until(
          () => adapterEvents(s.for).length >= n,
          `${n} event(s) matching ${show(s.for)}`,
          s.timeout_ms ?? 10_000,
        );
        return;
      }
      case 'publish': {
        for (const data of s.data) await server.api('/api/publish', { channel: s.channel, data });
        return;
      }
      case 'api':
        await server.api(s.path, subst(s.body ?? {}));
        return;
      case 'proxy':
        if (s.action === 'down') proxy.setDown();
        else if (s.action === 'up') proxy.setUp();
        else if (s.action === 'delay') proxy.delayMs = s.ms;
        else if (s.action === 'blackhole') proxy.blackhole();
        else throw new Error(`unknown proxy action ${s.action}`);
        log({ source: 'driver', event: `proxy_${s.action}` });
        return;
      case 'server':
        if (s.action === 'sigterm') await server.stop('SIGTERM', s.timeout_ms ?? 15_000, proxy.newestPort());
        else if (s.action === 'start') await server.start();
        else throw new Error(`unknown server action ${s.action}`);
        return;
      case 'metric': {
        // A server-side effect the client cannot show (e.g. deltas sent): the counter, summed over
        // the live nodes, reaches `at_least` within `timeout_ms`.
        let last = 0;
        await until(
          async () => (last = await server.metric(s.name)) >= s.at_least,
          `${s.name} ≥ ${s.at_least} over the nodes' /metrics`,
          s.timeout_ms ?? 5_000,
        ).catch((e) => {
          throw new Error(`${e.message} (last value ${last})`);
        });
        return;
      }
      case 'sleep':
        await sleep(s.ms);
        return;
      case 'mark':
        log({ source: 'driver', event: 'mark', name: s.name });
        return;
      default:
        throw new Error(`unknown step ${show(s)}`);
    }
  }

  const limit = sc.timeout_ms ?? 30_000;
  let failure;
  let timer;
  try {
    await server.start();
    await proxy.start();
    adapter = new Adapter(opts.adapter, log);
    await until(() => events.some((e) => e.event === 'ready'), 'the adapter to print {"event":"ready"}', 15_000);
    const body = (async () => {
      for (const [i, s] of sc.steps.entries()) {
        ctx.step = `step ${i + 1} ${show(s)}`;
        if (adapter.exitCode !== undefined) throw new Error(`the adapter exited (${adapter.exitCode})`);
        await step(s);
      }
    })();
    const overall = new Promise((_, rej) => {
      timer = setTimeout(() => rej(new Error(`scenario time limit ${limit} ms exceeded`)), limit);
    });
    await Promise.race([body, overall]);
    ctx.step = '(expectations)';
    // A multi-node run may expect other outcomes (e.g. recovery across a drain works on a shared
    // broker): the scenario's `cluster.expect` replaces `expect` there.
    const expectations = opts.nodes > 1 && sc.cluster?.expect ? sc.cluster.expect : sc.expect;
    const problems = check(expectations ?? [], events);
    if (problems.length) failure = problems.join('\n    ');
  } catch (e) {
    failure = `${ctx.step}: ${e.message}`;
  } finally {
    clearTimeout(timer);
    await adapter?.stop().catch(() => {});
    await proxy.close().catch(() => {});
    await server.stop('SIGKILL').catch(() => {});
    await backend.close().catch(() => {});
  }
  return { failure, events, ms: Date.now() - t0, adapterStderr: adapter?.stderr.join('') ?? '', serverOut: server.output.join('') };
}

// ---------------------------------------------------------------------------------------------
// Expectations

function check(expectations, events) {
  const problems = [];
  const sel = (pattern) => events.filter((e) => matches(e, pattern));
  const idx = (pattern, from = 0) => {
    for (let i = from; i < events.length; i++) if (matches(events[i], pattern)) return i;
    return -1;
  };
  for (const x of expectations) {
    const what = x.why ? `${x.why}: ` : '';
    switch (x.check) {
      case 'count': {
        const n = sel(x.match).length;
        if (x.equals !== undefined && n !== x.equals) problems.push(`${what}${n} events match ${show(x.match)}, expected exactly ${x.equals}`);
        if (x.min !== undefined && n < x.min) problems.push(`${what}${n} events match ${show(x.match)}, expected at least ${x.min}`);
        if (x.max !== undefined && n > x.max) problems.push(`${what}${n} events match ${show(x.match)}, expected at most ${x.max}`);
        break;
      }
      case 'publications': {
        // Exactly these data, in this order, each once, with strictly increasing offsets
        // (consecutive when `consecutive_offsets`). A publication without an offset (0: kept out
        // of history with `skip_history`) has no place in the offsets and is left out of that check.
        const delivered = events.filter((e) => e.source === 'adapter' && e.event === 'publication' && e.channel === x.channel);
        const data = delivered.map((p) => p.data);
        const pubs = delivered.filter((p) => p.offset !== 0);
        if (!matches(data, x.data)) problems.push(`${what}${x.channel} delivered ${show(data)}, expected ${show(x.data)}`);
        for (let i = 1; i < pubs.length; i++) {
          const sameEpoch = pubs[i].epoch === undefined || pubs[i].epoch === pubs[i - 1].epoch;
          if (sameEpoch && pubs[i].offset <= pubs[i - 1].offset) {
            problems.push(`${what}${x.channel} offset ${pubs[i].offset} after ${pubs[i - 1].offset}`);
          }
          if (x.consecutive_offsets && sameEpoch && pubs[i].offset !== pubs[i - 1].offset + 1) {
            problems.push(`${what}${x.channel} offset ${pubs[i].offset} after ${pubs[i - 1].offset}: not consecutive`);
          }
        }
        break;
      }
      case 'order': {
        // The patterns occur in this order (as a subsequence of the log).
        let at = 0;
        for (const p of x.matches) {
          const i = idx(p, at);
          if (i < 0) {
            problems.push(`${what}no ${show(p)} after position ${at} (order ${show(x.matches)})`);
            break;
          }
          at = i + 1;
        }
        break;
      }
      case 'none_after': {
        const i = idx(x.after);
        if (i < 0) {
          problems.push(`${what}no ${show(x.after)} in the log`);
          break;
        }
        const late = events.slice(i + 1).filter((e) => matches(e, x.match));
        if (late.length) problems.push(`${what}${late.length} ${show(x.match)} after ${show(x.after)}, e.g. ${show(late[0])}`);
        break;
      }
      case 'reconnect_honours_after_ms': {
        // Every disconnect push with after_ms: the client's next TCP connection comes no sooner.
        const pushes = events.map((e, i) => [e, i]).filter(([e]) => e.event === 'disconnect_push' && e.after_ms !== undefined);
        if (pushes.length === 0) problems.push(`${what}no disconnect push with after_ms was seen`);
        for (const [p, i] of pushes) {
          const next = events.slice(i + 1).find((e) => e.event === 'proxy_accept' || e.event === 'proxy_refused');
          if (!next) {
            problems.push(`${what}no reconnect attempt after the disconnect push ${show(p)}`);
            continue;
          }
          const waited = next.at - p.at;
          const tolerance = x.tolerance_ms ?? 10;
          if (waited + tolerance < p.after_ms) problems.push(`${what}reconnected ${waited} ms after a push with after_ms ${p.after_ms}`);
        }
        break;
      }
      case 'reconnected_to_another_node': {
        // The first connection after each disconnect push goes to another node than the one before.
        const pushes = events.map((e, i) => [e, i]).filter(([e]) => e.event === 'disconnect_push');
        if (pushes.length === 0) problems.push(`${what}no disconnect push was seen`);
        for (const [p, i] of pushes) {
          const before = events.slice(0, i).findLast((e) => e.event === 'proxy_accept');
          const after = events.slice(i + 1).find((e) => e.event === 'proxy_accept');
          if (!before || !after) problems.push(`${what}no connection before and after ${show(p)}`);
          else if (before.port === after.port) problems.push(`${what}reconnected to the same node (port ${after.port}) after ${show(p)}`);
        }
        break;
      }
      default:
        problems.push(`unknown check ${show(x)}`);
    }
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  let failed = 0;
  for (const file of opts.files) {
    const sc = JSON.parse(readFileSync(file, 'utf8'));
    if (opts.only && sc.name !== opts.only) continue;
    if (opts.nodes > 1 && sc.cluster?.skip) {
      console.log(`SKIP  ${sc.name} [with ${opts.nodes} nodes: ${sc.cluster.skip}]`);
      continue;
    }
    const r = await runScenario(sc, opts);
    const secs = (r.ms / 1000).toFixed(2);
    let verdict;
    if (sc.expected_failure) verdict = r.failure ? 'XFAIL' : 'XPASS';
    else verdict = r.failure ? 'FAIL' : 'PASS';
    const bad = verdict === 'FAIL' || verdict === 'XPASS';
    if (bad) failed++;
    let line = `${verdict.padEnd(5)} ${sc.name} (${secs} s)`;
    if (verdict === 'XFAIL') line += ` [expected to fail: ${sc.expected_failure}]`;
    if (verdict === 'XPASS') line += ' [marked expected_failure but passed: remove the mark]';
    console.log(line);
    if (r.failure && (verdict === 'FAIL' || opts.verbose)) console.log(`    ${r.failure}`);
    if (bad || opts.verbose) {
      console.log('    event log:');
      for (const e of r.events) console.log(`      ${show(e)}`);
      if (r.adapterStderr.trim()) console.log(`    adapter stderr:\n${r.adapterStderr.replace(/^/gm, '      ')}`);
      if (bad && r.serverOut.trim()) console.log(`    herald output (tail):\n${r.serverOut.slice(-3000).replace(/^/gm, '      ')}`);
    }
  }
  const mode = opts.nodes > 1 ? ` (${opts.nodes} nodes on Redis)` : '';
  console.log(failed ? `conformance${mode}: ${failed} scenario(s) failed` : `conformance${mode}: all scenarios passed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(`conformance driver: ${e.message}`);
  process.exit(2);
});
