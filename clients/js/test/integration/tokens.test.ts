// Token handling against the real server: getToken for the first connect, `refresh` before expiry
// keeps one connection alive past the first token's lifetime, and after a 4004 close the client
// fetches a new token and reconnects. Subscription tokens the same way: `sub_refresh` before expiry,
// a fresh token after the server ends the subscription with unsub 4004.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Herald } from '../../src/node.js';
import { signHS256 } from '../support/jwt.js';
import { HeraldServer, sleep, waitFor } from '../support/server.js';

const SECRET = 'test-secret-0123456789';
let server: HeraldServer;
let configDir: string | undefined;

beforeAll(async () => {
  // `priv:` channels need a subscription token.
  configDir = mkdtempSync(join(tmpdir(), 'herald-sdk-'));
  const config = join(configDir, 'herald.toml');
  writeFileSync(config, '[[namespaces]]\nname = "priv"\nsubscribe = "token"\n');
  server = await HeraldServer.start(inject('heraldBin'), {
    env: { HERALD_TOKEN_HMAC_SECRET: SECRET },
    args: ['--config', config],
  });
});
afterAll(async () => {
  await server?.stop();
  if (configDir) rmSync(configDir, { recursive: true, force: true });
});

const token = (sub: string, ttlSec: number) =>
  signHS256({ sub, exp: Math.floor(Date.now() / 1000) + ttlSec, info: { name: sub } }, SECRET);

describe('connection tokens', () => {
  it('refreshes before expiry and keeps the connection', async () => {
    let calls = 0;
    const client = new Herald(server.ws, {
      getToken: async () => {
        calls++;
        return token('alice', 3);
      },
    });
    const connecting: number[] = [];
    let expiresIn: number | undefined;
    client.on('connecting', (c) => connecting.push(c.code));
    client.on('connected', (c) => (expiresIn = c.expiresIn));
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('tok-refresh', { onPublication: (p) => got.push(p.data.n) });
    client.connect();
    await sub.ready();
    expect(expiresIn).toBeGreaterThan(0);
    expect(expiresIn).toBeLessThanOrEqual(3);
    await sleep(7000);
    expect(calls).toBeGreaterThanOrEqual(3);
    expect(client.state).toBe('connected');
    expect(connecting).toHaveLength(1); // only the initial connect: never dropped
    await server.publish('tok-refresh', { n: 1 });
    await waitFor(() => got.length === 1, 'publication after refreshes');
    client.disconnect();
  });

  it('publishes with the token user in info', async () => {
    const client = new Herald(server.ws, { token: token('bob', 60) });
    const infos: unknown[] = [];
    const sub = client.subscribe('tok-info', { onPublication: (p) => infos.push(p.info) });
    client.connect();
    await sub.ready();
    await client.publish('tok-info', 'hi');
    await waitFor(() => infos.length === 1, 'own publication');
    expect(infos[0]).toMatchObject({ user: 'bob', client: client.clientId });
    client.disconnect();
  });

  it('gets a new token and reconnects after the server closes with 4004', async () => {
    let calls = 0;
    const client = new Herald(server.ws, {
      minReconnectDelayMs: 100,
      getToken: async () => {
        calls++;
        // The refresh (second call) is too slow: the token expires first and the server closes 4004.
        if (calls === 2) await sleep(4000);
        return token('carol', 2);
      },
    });
    const connecting: number[] = [];
    client.on('connecting', (c) => connecting.push(c.code));
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('tok-expire', { onPublication: (p) => got.push(p.data.n) });
    client.connect();
    await sub.ready();
    await server.publish('tok-expire', { n: 1 });
    await waitFor(() => connecting.includes(4004), 'close 4004', 10_000);
    await waitFor(() => client.state === 'connected', 'reconnect with a fresh token', 10_000);
    expect(calls).toBeGreaterThanOrEqual(3);
    await server.publish('tok-expire', { n: 2 });
    await waitFor(() => got.length === 2, 'publications around the 4004');
    expect(got).toEqual([1, 2]);
    client.disconnect();
  });

  it('stays down with a bad token (4501 or 101)', async () => {
    const client = new Herald(server.ws, { token: signHS256({ sub: 'x' }, 'wrong-secret') });
    const seen: number[] = [];
    client.on('disconnected', (c) => seen.push(c.code));
    client.connect();
    await waitFor(() => client.state === 'disconnected', 'disconnected');
    expect([4501, 101]).toContain(seen[0]);
  });
});

const subToken = (sub: string, channel: string, ttlSec: number) =>
  signHS256({ sub, channel, exp: Math.floor(Date.now() / 1000) + ttlSec }, SECRET);

describe('subscription tokens', () => {
  it('sends sub_refresh before the subscription token expires and keeps the subscription', async () => {
    let calls = 0;
    const client = new Herald(server.ws, { token: token('dave', 60) });
    const ended: number[] = [];
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('priv:refresh', {
      getToken: async (channel) => {
        calls++;
        return subToken('dave', channel, 3);
      },
      onPublication: (p) => got.push(p.data.n),
      onUnsubscribed: (u) => ended.push(u.code),
    });
    client.connect();
    await sub.ready();
    await sleep(7000);
    expect(calls).toBeGreaterThanOrEqual(3);
    expect(ended).toEqual([]);
    expect(sub.state).toBe('subscribed');
    await server.publish('priv:refresh', { n: 1 });
    await waitFor(() => got.length === 1, 'publication after sub_refresh');
    client.disconnect();
  });

  it('fetches a new token after unsub 4004 and recovers what it missed', async () => {
    let calls = 0;
    const client = new Herald(server.ws, { token: token('erin', 60) });
    const errors: string[] = [];
    client.on('error', (e) => errors.push(e.type));
    const got: number[] = [];
    const subscribed: boolean[] = [];
    const sub = client.subscribe<{ n: number }>('priv:expire', {
      getToken: async (channel) => {
        calls++;
        // The refresh (second call) is too slow: the token expires and the server sends unsub 4004.
        if (calls === 2) await sleep(4000);
        return subToken('erin', channel, 2);
      },
      onPublication: (p) => got.push(p.data.n),
      onSubscribed: (s) => subscribed.push(s.recovered),
    });
    client.connect();
    await sub.ready();
    await server.publish('priv:expire', { n: 1 });
    await waitFor(() => got.length === 1, 'first publication');
    await waitFor(() => calls >= 3, 'a fresh token after unsub 4004', 10_000);
    await server.publish('priv:expire', { n: 2 });
    await waitFor(() => got.length === 2, 'publications around the 4004', 10_000);
    expect(got).toEqual([1, 2]);
    // A resubscribe happened (the unsub 4004), and it recovered from the position held.
    expect(subscribed.length).toBeGreaterThanOrEqual(2);
    expect(subscribed.slice(1).every((r) => r)).toBe(true);
    expect(client.state).toBe('connected');
    client.disconnect();
  });

  it('ends the subscription when getToken gives nothing', async () => {
    const client = new Herald(server.ws, { token: token('frank', 60) });
    const ended: number[] = [];
    client.subscribe('priv:none', { getToken: () => null, onUnsubscribed: (u) => ended.push(u.code) });
    client.connect();
    await waitFor(() => ended.length === 1, 'subscription ended');
    expect(ended).toEqual([5]); // ClientCode.NoToken
    client.disconnect();
  });
});
