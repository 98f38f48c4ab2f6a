// The everyday API against the real server: publish from a client, history, presence with join and
// leave, typed errors, the subprotocol, and the close-code rule on a server-side disconnect.
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { ClientCode, Herald, ReplyError, UsageError } from '../../src/node.js';
import { HeraldServer, waitFor } from '../support/server.js';

let server: HeraldServer;
const clients: Herald[] = [];

function newClient(opts: ConstructorParameters<typeof Herald>[1] = {}): Herald {
  const c = new Herald(server.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500, ...opts });
  clients.push(c);
  return c;
}

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'));
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await server?.stop();
});

describe('client API against a real server', () => {
  it('connects and reports the connect result', async () => {
    const c = newClient({ name: 'vitest', version: '0.0.0' });
    const connected = new Promise<{ client: string; pingInterval: number }>((r) => c.once('connected', r));
    c.connect();
    const ctx = await connected;
    expect(ctx.client).toEqual(expect.any(String));
    expect(ctx.client.length).toBeGreaterThan(0);
    expect(ctx.pingInterval).toBeGreaterThan(0);
    expect(c.state).toBe('connected');
    expect(c.clientId).toBe(ctx.client);
  });

  it('publishes from a client to other subscribers, in order', async () => {
    const a = newClient();
    const b = newClient();
    const got: string[] = [];
    const sub = b.subscribe<{ text: string }>('api-chat', { onPublication: (p) => got.push(p.data.text) });
    a.connect();
    b.connect();
    await sub.ready();
    const results = [];
    for (const text of ['one', 'two', 'three']) results.push(await a.publish('api-chat', { text }));
    expect(results.map((r) => r.offset)).toEqual([1, 2, 3]);
    expect(new Set(results.map((r) => r.epoch)).size).toBe(1);
    await waitFor(() => got.length === 3, 'three publications');
    expect(got).toEqual(['one', 'two', 'three']);
  });

  it('reads history, whole and since a position', async () => {
    for (let n = 1; n <= 5; n++) await server.publish('api-history', { n });
    const c = newClient();
    c.connect();
    const all = await c.history('api-history');
    expect(all.offset).toBe(5);
    expect(all.publications.map((p) => (p.data as { n: number }).n)).toEqual([1, 2, 3, 4, 5]);
    const tail = await c.history('api-history', { since: { epoch: all.epoch, offset: 3 } });
    expect(tail.publications.map((p) => p.offset)).toEqual([4, 5]);
  });

  it('resumes a subscription from a stored position (since)', async () => {
    for (let n = 1; n <= 4; n++) await server.publish('api-since', { n });
    const c = newClient();
    c.connect();
    const h = await c.history('api-since');
    const got: number[] = [];
    const sub = c.subscribe<{ n: number }>('api-since', {
      since: { epoch: h.epoch, offset: 2 },
      onPublication: (p) => got.push(p.data.n),
    });
    await sub.ready();
    await waitFor(() => got.length === 2, 'recovered publications');
    await server.publish('api-since', { n: 5 });
    await waitFor(() => got.length === 3, 'live publication');
    expect(got).toEqual([3, 4, 5]);
    expect(sub.position).toEqual({ epoch: h.epoch, offset: 5 });
  });

  it('shows presence and delivers join and leave', async () => {
    const a = newClient();
    const joins: string[] = [];
    const leaves: string[] = [];
    const subA = a.subscribe('api-room', {
      onJoin: (c) => joins.push(c.info.client),
      onLeave: (c) => leaves.push(c.info.client),
    });
    a.connect();
    await subA.ready();
    const b = newClient();
    const subB = b.subscribe('api-room');
    b.connect();
    await subB.ready();
    const aId = a.clientId;
    const bId = b.clientId;
    if (!aId || !bId) throw new Error('connected clients have no clientId');
    await waitFor(() => joins.includes(bId), 'join of b');
    const p = await a.presence('api-room');
    expect(Object.keys(p.clients).sort()).toEqual([aId, bId].sort());
    subB.unsubscribe();
    await waitFor(() => leaves.includes(bId), 'leave of b');
  });

  it('hands errors over as typed objects with the protocol code', async () => {
    const c = newClient();
    c.connect();
    await c.ready();
    const err = (await c.call('no_such_method', {}).catch((e: unknown) => e)) as ReplyError;
    expect(err).toBeInstanceOf(ReplyError);
    expect(err.code).toBe(104);
    const bad = await c.publish('bad channel!', 1).catch((e) => e);
    expect(bad).toBeInstanceOf(ReplyError);
    expect(bad.code).toBe(107);
    expect(() => c.subscribe('bad channel!')).toThrow(UsageError);
  });

  it('negotiates the herald.v1.json subprotocol when asked', async () => {
    const c = newClient({ protocols: 'herald.v1.json' });
    c.connect();
    await c.ready();
    expect(await c.publish('api-proto', 1)).toMatchObject({ offset: 1 });
  });

  it('stays down after the server API disconnects it (4502), and can connect again', async () => {
    const c = newClient();
    const seen: Array<{ code: number }> = [];
    c.on('disconnected', (ctx) => seen.push(ctx));
    c.connect();
    await c.ready();
    await server.api('/api/disconnect', { client: c.clientId });
    await waitFor(() => c.state === 'disconnected', 'disconnected');
    expect(seen.map((s) => s.code)).toEqual([4502]);
    c.connect();
    await c.ready();
    c.disconnect();
    expect(seen.map((s) => s.code)).toEqual([4502, ClientCode.DisconnectCalled]);
  });
});
