// Proxy hooks through the SDK, against the real server and a real application backend (the Python
// one the server's own tests use): a session cookie on the WebSocket upgrade authenticates through
// the connect proxy, `rpc()` is answered by the backend, the subscribe proxy sees a subscription's
// `data` and answers with its own, and the user's server-side personal
// channel is recovered with `since` after the connection is really cut.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import WS from 'ws';
import {
  ErrorCode,
  Herald,
  ReplyError,
  type ServerSubscribedContext,
  type WebSocketConstructor,
} from '../../src/node.js';
import { repoRoot } from '../support/global-setup.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, waitFor } from '../support/server.js';

let backend: ChildProcess;
let server: HeraldServer;

async function startBackend(): Promise<{ child: ChildProcess; port: number }> {
  const script = resolve(repoRoot, 'crates', 'server', 'tests', 'fixtures', 'proxy_backend.py');
  const child = spawn('python3', [script], { stdio: ['ignore', 'pipe', 'ignore'] });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const line = await new Promise<string>((ok, fail) => {
    lines.once('line', ok);
    child.once('exit', () => fail(new Error('proxy backend exited')));
  });
  return { child, port: Number(line.replace('listening ', '')) };
}

/** A WebSocket whose upgrade request carries this Cookie header, as a browser's would. */
function withCookie(cookie: string): WebSocketConstructor {
  return class extends WS {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols, { headers: { Cookie: cookie } });
    }
  } as unknown as WebSocketConstructor;
}

let configDir: string | undefined;

beforeAll(async () => {
  const b = await startBackend();
  backend = b.child;
  const url = (hook: string) => JSON.stringify(`http://127.0.0.1:${b.port}/${hook}`);
  configDir = mkdtempSync(join(tmpdir(), 'herald-sdk-'));
  const config = join(configDir, 'herald.toml');
  writeFileSync(
    config,
    [
      'personal_channel = "user:#{user}"',
      '[proxy]',
      `connect_url = ${url('connect')}`,
      `rpc_url = ${url('rpc')}`,
      `subscribe_url = ${url('subscribe')}`,
      'cookies = ["sessionid"]',
      '[[namespaces]]',
      'name = "user"',
      'subscribe = "token"',
      'history_size = 100',
      '[[namespaces]]',
      'name = "room"',
      'subscribe = "token"',
      'subscribe_proxy = true',
    ].join('\n'),
  );
  server = await HeraldServer.start(inject('heraldBin'), { args: ['--config', config] });
});
afterAll(async () => {
  await server?.stop();
  backend?.kill();
  if (configDir) rmSync(configDir, { recursive: true, force: true });
});

describe('proxy hooks', () => {
  it('connects with a session cookie and calls the backend with rpc()', async () => {
    const client = new Herald(server.ws, {
      WebSocket: withCookie('sessionid=alice; other=x'),
      data: { tab: 1 },
      timeoutMs: 5000,
    });
    let connectData: unknown;
    client.on('connected', (c) => (connectData = c.data));
    client.connect();
    await client.ready();
    expect(connectData).toEqual({
      headers: {},
      cookies: { sessionid: 'alice' },
      ip: '127.0.0.1',
      transport: 'websocket',
      data: { tab: 1 },
    });

    const answer = await client.rpc<{ method: string; user: string; data: unknown }>('echo', { q: [1, 2] });
    expect(answer).toEqual({ method: 'echo', user: 'alice', data: { q: [1, 2] } });
    const failed = await client.rpc('fail').catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(ReplyError);
    expect((failed as ReplyError).code).toBe(1500);
    expect((failed as ReplyError).message).toBe('no such thing');

    // The subscribe proxy gets the subscription's data and answers with its own.
    let subscribedData: unknown;
    const room = client.subscribe('room:lobby', { data: { pin: 7 }, onSubscribed: (c) => (subscribedData = c.data) });
    await room.ready();
    expect(subscribedData).toEqual({ channel: 'room:lobby', user: 'alice', data: { pin: 7 } });
    const denied = client.subscribe('room:deny-me');
    const refusal = await denied.ready().catch((e: unknown) => e);
    expect((refusal as ReplyError).code).toBe(1403);
    client.disconnect();
  });

  it('refuses rpc() where no RPC proxy is configured', async () => {
    const plain = await HeraldServer.start(inject('heraldBin'));
    try {
      const client = new Herald(plain.ws);
      client.connect();
      await client.ready();
      const failed = await client.rpc('echo').catch((e: unknown) => e);
      expect((failed as ReplyError).code).toBe(ErrorCode.NotAvailable);
      client.disconnect();
    } finally {
      await plain.stop();
    }
  });

  it('recovers the server-side personal channel after a real cut, once each and in order', async () => {
    const proxy = await new CutProxy(server.port).start();
    const client = new Herald(proxy.ws, {
      WebSocket: withCookie('sessionid=bob'),
      minReconnectDelayMs: 100,
      maxReconnectDelayMs: 300,
      timeoutMs: 5000,
    });
    const subscribed: ServerSubscribedContext[] = [];
    const got: number[] = [];
    client.on('subscribed', (s) => subscribed.push(s));
    client.on('publication', (p) => {
      if (p.channel === 'user:#bob') got.push((p.data as { n: number }).n);
    });
    client.connect();
    await client.ready();
    expect(subscribed.map((s) => s.channel)).toEqual(['user:#bob']);

    await server.publish('user:#bob', { n: 1 });
    await waitFor(() => got.length === 1, 'first publication');
    await proxy.cut();
    await waitFor(() => client.state === 'connecting', 'the cut to be noticed');
    await server.publish('user:#bob', { n: 2 });
    await server.publish('user:#bob', { n: 3 });
    await proxy.restore();
    await waitFor(() => subscribed.length === 2, 'the server-side subscription again');
    expect(subscribed[1].recovered).toBe(true);
    await server.publish('user:#bob', { n: 4 });
    await waitFor(() => got.length >= 4, 'every publication');
    expect(got).toEqual([1, 2, 3, 4]);
    client.disconnect();
    await proxy.stop();
  });
});
