// The Pusher protocol against the real server, with the real npm clients: pusher-js 8 as the
// WebSocket client, the official `pusher` server SDK for HTTP API calls and channel signatures.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import PusherServer from 'pusher';
import Pusher from 'pusher-js';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { withPusherCatchUp } from '../../src/node.js';
import { freePort, HeraldServer, waitFor } from '../support/server.js';

const OPEN = { id: 'app-open', key: 'key-open', secret: 'secret-open' };
const CLOSED = { id: 'app-closed', key: 'key-closed', secret: 'secret-closed' };

let server: HeraldServer;
let dir: string;
let hookServer: Server;
type HookEvent = { name: string; channel: string; [k: string]: unknown };
const hooks: Array<{ valid: boolean; events: HookEvent[] }> = [];
const clients: Pusher[] = [];

type App = typeof OPEN;
type PresenceData = { user_id: string; user_info?: Record<string, unknown> };

function backend(app: App = OPEN): PusherServer {
  return new PusherServer({
    appId: app.id,
    key: app.key,
    secret: app.secret,
    host: '127.0.0.1',
    port: String(server.port),
    useTLS: false,
  });
}

/** A pusher-js client whose channel authorizations the official server SDK signs. */
function client(app: App = OPEN, presence?: PresenceData, signer: App = app): Pusher {
  const signing = backend(signer);
  const c = new Pusher(app.key, {
    cluster: 'mt1',
    wsHost: '127.0.0.1',
    wsPort: server.port,
    forceTLS: false,
    enabledTransports: ['ws'],
    disableStats: true,
    channelAuthorization: {
      endpoint: '/unused',
      transport: 'ajax',
      customHandler: (params, callback) => {
        callback(null, signing.authorizeChannel(params.socketId, params.channelName, presence));
      },
    },
  });
  clients.push(c);
  return c;
}

function connected(c: Pusher): Promise<void> {
  return new Promise((resolve, reject) => {
    if (c.connection.state === 'connected') return resolve();
    c.connection.bind('connected', () => resolve());
    c.connection.bind('failed', () => reject(new Error('connection failed')));
  });
}

function subscribed(c: Pusher, name: string) {
  const channel = c.subscribe(name);
  const ready = new Promise<unknown>((resolve, reject) => {
    channel.bind('pusher:subscription_succeeded', resolve);
    channel.bind('pusher:subscription_error', (e: unknown) => reject(new Error(JSON.stringify(e))));
  });
  return { channel, ready };
}

/** Calls a signed API path with the SDK's own `get`, returning status and body even on errors. */
async function apiGet(path: string, params: Record<string, string> = {}) {
  try {
    const r = await backend().get({ path, params });
    return { status: r.status, body: await r.json() };
  } catch (e) {
    const err = e as { status?: number; body?: string };
    return { status: err.status ?? 0, body: err.body };
  }
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'herald-pusher-'));
  // Receives webhooks and checks them with the official SDK.
  const hookPort = await freePort();
  hookServer = createServer((req, res) => {
    let rawBody = '';
    req.on('data', (d) => {
      rawBody += d;
    });
    req.on('end', () => {
      const hook = backend().webhook({ headers: req.headers as Record<string, string>, rawBody });
      const valid = hook.isValid();
      hooks.push({ valid, events: valid ? (hook.getEvents() as unknown as HookEvent[]) : [] });
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((r) => hookServer.listen(hookPort, '127.0.0.1', r));
  const config = join(dir, 'herald.toml');
  writeFileSync(
    config,
    `[[pusher.apps]]
id = "${OPEN.id}"
key = "${OPEN.key}"
secret = "${OPEN.secret}"
enable_client_events = true
webhooks = [{ url = "http://127.0.0.1:${hookPort}/hook" }]

[[pusher.apps]]
id = "${CLOSED.id}"
key = "${CLOSED.key}"
secret = "${CLOSED.secret}"
`,
  );
  server = await HeraldServer.start(inject('heraldBin'), { args: ['--config', config] });
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await server?.stop();
  hookServer?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('pusher-js against Herald', () => {
  it('connects, subscribes to a public channel and receives an event triggered with the server SDK', async () => {
    const c = client();
    await connected(c);
    expect(c.connection.socket_id).toMatch(/^\d+\.\d+$/);
    const { channel, ready } = subscribed(c, 'news');
    await ready;
    const got: unknown[] = [];
    channel.bind('headline', (data: unknown) => got.push(data));
    const r = await backend().trigger('news', 'headline', { title: 'hello' });
    expect(r.status).toBe(200);
    await waitFor(() => got.length === 1, 'the event');
    expect(got[0]).toEqual({ title: 'hello' });
  });

  it('excludes the socket_id given to trigger, and keeps apps apart', async () => {
    const a = client();
    const b = client();
    const other = client(CLOSED);
    await Promise.all([connected(a), connected(b), connected(other)]);
    const got = { a: [] as unknown[], b: [] as unknown[], other: [] as unknown[] };
    for (const [name, c] of [
      ['a', a],
      ['b', b],
      ['other', other],
    ] as const) {
      const { channel, ready } = subscribed(c, 'shared');
      channel.bind('ping', (d: unknown) => got[name].push(d));
      await ready;
    }
    await backend().trigger('shared', 'ping', { n: 1 }, { socket_id: a.connection.socket_id });
    await waitFor(() => got.b.length === 1, 'b receives');
    await backend().triggerBatch([{ channel: 'shared', name: 'ping', data: { n: 2 } }]);
    await waitFor(() => got.a.length === 1 && got.b.length === 2, 'the batch');
    expect(got.a).toEqual([{ n: 2 }]);
    expect(got.other).toEqual([]);
  });

  it('subscribes to a private channel with an authorizeChannel signature and refuses a forged one', async () => {
    const good = client();
    const { channel, ready } = subscribed(good, 'private-orders');
    await ready;
    const got: unknown[] = [];
    channel.bind('created', (d: unknown) => got.push(d));
    await backend().trigger('private-orders', 'created', { id: 7 });
    await waitFor(() => got.length === 1, 'the private event');

    // Signed with another app's secret: the server refuses the subscription.
    const forged = client(OPEN, undefined, { ...OPEN, secret: 'not-the-secret' });
    const errors: Array<{ type: string; status: number }> = [];
    forged.subscribe('private-orders').bind('pusher:subscription_error', (e: { type: string; status: number }) => {
      errors.push(e);
    });
    await waitFor(() => errors.length === 1, 'subscription_error');
    expect(errors[0]).toMatchObject({ type: 'AuthError', status: 401 });
    await backend().trigger('private-orders', 'created', { id: 8 });
    await waitFor(() => got.length === 2, 'the good subscriber still receives');
    expect(forged.connection.state).toBe('connected');
  });

  it('tracks presence members: the list on subscribe, member_added and member_removed', async () => {
    const alice = client(OPEN, { user_id: 'alice', user_info: { name: 'Alice' } });
    const a = subscribed(alice, 'presence-room');
    await a.ready;
    const ch = a.channel as unknown as {
      members: { count: number; me: { id: string }; each: (f: (m: { id: string; info: unknown }) => void) => void };
    };
    expect(ch.members.count).toBe(1);
    expect(ch.members.me.id).toBe('alice');
    const added: Array<{ id: string; info: unknown }> = [];
    const removed: string[] = [];
    a.channel.bind('pusher:member_added', (m: { id: string; info: unknown }) => added.push(m));
    a.channel.bind('pusher:member_removed', (m: { id: string }) => removed.push(m.id));

    const bob = client(OPEN, { user_id: 'bob', user_info: { name: 'Bob' } });
    const b = subscribed(bob, 'presence-room');
    await b.ready;
    const ids: string[] = [];
    (b.channel as unknown as typeof ch).members.each((m) => ids.push(m.id));
    expect(ids.sort()).toEqual(['alice', 'bob']);
    await waitFor(() => added.length === 1, 'member_added');
    expect(added[0]).toEqual({ id: 'bob', info: { name: 'Bob' } });

    const users = await apiGet('/channels/presence-room/users');
    expect(users.status).toBe(200);
    expect((users.body as { users: Array<{ id: string }> }).users.map((u) => u.id).sort()).toEqual(['alice', 'bob']);

    bob.unsubscribe('presence-room');
    await waitFor(() => removed.length === 1, 'member_removed');
    expect(removed).toEqual(['bob']);
  });

  it('relays client events on private channels when enabled, not back to the sender', async () => {
    const a = client();
    const b = client();
    const sa = subscribed(a, 'private-chat');
    const sb = subscribed(b, 'private-chat');
    await Promise.all([sa.ready, sb.ready]);
    const gotA: unknown[] = [];
    const gotB: unknown[] = [];
    sa.channel.bind('client-typing', (d: unknown) => gotA.push(d));
    sb.channel.bind('client-typing', (d: unknown) => gotB.push(d));
    expect(sa.channel.trigger('client-typing', { who: 'a' })).toBe(true);
    await waitFor(() => gotB.length === 1, 'b gets the client event');
    expect(gotB[0]).toEqual({ who: 'a' });
    await backend().trigger('private-chat', 'marker', {});
    await new Promise((r) => setTimeout(r, 200));
    expect(gotA).toEqual([]);
  });

  it('refuses client events where the app disables them', async () => {
    const a = client(CLOSED);
    const b = client(CLOSED);
    const sa = subscribed(a, 'private-chat');
    const sb = subscribed(b, 'private-chat');
    await Promise.all([sa.ready, sb.ready]);
    const errors: Array<{ type: string; data: { message: string } }> = [];
    a.connection.bind('error', (e: { type: string; data: { message: string } }) => errors.push(e));
    const gotB: unknown[] = [];
    sb.channel.bind('client-typing', (d: unknown) => gotB.push(d));
    sa.channel.trigger('client-typing', { who: 'a' });
    await waitFor(() => errors.length === 1, 'pusher:error');
    expect(errors[0].type).toBe('PusherError');
    expect(errors[0].data.message).toMatch(/client events/);
    expect(gotB).toEqual([]);
    expect(a.connection.state).toBe('connected');
  });

  it('closes an unknown app key with 4001 and does not reconnect', async () => {
    const c = client({ ...OPEN, key: 'no-such-key' });
    type Refusal = { error?: { data?: { code?: number } } };
    const errors: Refusal[] = [];
    c.connection.bind('error', (e: Refusal) => errors.push(e));
    await waitFor(() => errors.some((e) => e.error?.data?.code === 4001), 'error 4001');
    await waitFor(() => c.connection.state === 'disconnected', 'refused connection');
    await new Promise((r) => setTimeout(r, 500));
    expect(c.connection.state).toBe('disconnected');
  });
});

describe('user authentication', () => {
  function signedIn(id: string, signer: App = OPEN): Pusher {
    const signing = backend(signer);
    const c = new Pusher(OPEN.key, {
      cluster: 'mt1',
      wsHost: '127.0.0.1',
      wsPort: server.port,
      forceTLS: false,
      enabledTransports: ['ws'],
      disableStats: true,
      userAuthentication: {
        endpoint: '/unused',
        transport: 'ajax',
        customHandler: (params, callback) => {
          callback(null, signing.authenticateUser(params.socketId, { id, user_info: { name: id } }));
        },
      },
    });
    clients.push(c);
    c.signin();
    return c;
  }

  it('signs in, receives sendToUser events, and terminate_connections closes it with 4009', async () => {
    const carol = signedIn('carol');
    const other = signedIn('dave');
    const got: unknown[] = [];
    carol.user.bind('greeting', (d: unknown) => got.push(d));
    const gotOther: unknown[] = [];
    other.user.bind('greeting', (d: unknown) => gotOther.push(d));
    await Promise.all([carol.user.signinDonePromise, other.user.signinDonePromise]);
    expect(carol.user.user_data).toMatchObject({ id: 'carol' });
    // The user channel subscription follows the sign-in; retry until it is in place.
    await waitFor(async () => {
      await backend().sendToUser('carol', 'greeting', { hi: 'carol' });
      await new Promise((r) => setTimeout(r, 100));
      return got.length > 0;
    }, 'sendToUser');
    expect(got[0]).toEqual({ hi: 'carol' });
    expect(gotOther).toEqual([]);

    const errors: Array<{ error?: { data?: { code?: number } } }> = [];
    carol.connection.bind('error', (e: { error?: { data?: { code?: number } } }) => errors.push(e));
    const r = await backend().terminateUserConnections('carol');
    expect(r.status).toBe(200);
    await waitFor(() => carol.connection.state === 'disconnected', 'carol disconnected');
    expect(errors.some((e) => e.error?.data?.code === 4009)).toBe(true);
    expect(other.connection.state).toBe('connected');
  });

  it('closes a connection whose sign-in signature is forged with 4009', async () => {
    const mallory = signedIn('mallory', { ...OPEN, secret: 'guessed' });
    const errors: Array<{ error?: { data?: { code?: number } } }> = [];
    mallory.connection.bind('error', (e: { error?: { data?: { code?: number } } }) => errors.push(e));
    await waitFor(() => mallory.connection.state === 'disconnected', 'refused sign-in');
    expect(errors.some((e) => e.error?.data?.code === 4009)).toBe(true);
  });
});

describe('catch-up extension with pusher-js', () => {
  it('a client that reconnects gets what it missed, once, in order', async () => {
    const c = withPusherCatchUp(client());
    const got: number[] = [];
    const { channel, ready } = subscribed(c, 'feed');
    channel.bind('item', (d: { n: number }) => got.push(d.n));
    await ready;
    await backend().trigger('feed', 'item', { n: 1 });
    await waitFor(() => got.length === 1, 'item 1');

    c.disconnect();
    await waitFor(() => c.connection.state === 'disconnected', 'disconnected');
    await backend().trigger('feed', 'item', { n: 2 });
    await backend().trigger('feed', 'item', { n: 3 });
    c.connect();
    await waitFor(() => got.length === 3, 'items missed while away');
    await backend().trigger('feed', 'item', { n: 4 });
    await waitFor(() => got.length === 4, 'item 4');
    expect(got).toEqual([1, 2, 3, 4]);
  });

  it('a stock client misses what was published while it was away', async () => {
    const c = client();
    const got: number[] = [];
    const { channel, ready } = subscribed(c, 'feed-stock');
    channel.bind('item', (d: { n: number }) => got.push(d.n));
    await ready;
    c.disconnect();
    await waitFor(() => c.connection.state === 'disconnected', 'disconnected');
    await backend().trigger('feed-stock', 'item', { n: 1 });
    c.connect();
    const resubscribed = new Promise((r) => channel.bind('pusher:subscription_succeeded', r));
    await resubscribed;
    await backend().trigger('feed-stock', 'item', { n: 2 });
    await waitFor(() => got.length === 1, 'item 2');
    expect(got).toEqual([2]);
  });
});

describe('webhooks', () => {
  const seen = (name: string, channel: string) =>
    hooks.flatMap((h) => h.events).find((e) => e.name === name && e.channel === channel);

  it('reports occupied, vacated, member_added, member_removed and client events, signed', async () => {
    const a = client(OPEN, { user_id: 'zoe' });
    const b = client(OPEN, { user_id: 'yann' });
    const s = subscribed(a, 'hooked');
    await s.ready;
    await waitFor(() => seen('channel_occupied', 'hooked'), 'channel_occupied');

    await subscribed(a, 'presence-hooks').ready;
    await waitFor(() => seen('member_added', 'presence-hooks'), 'member_added');
    expect(seen('member_added', 'presence-hooks')).toMatchObject({ user_id: 'zoe' });

    const pa = subscribed(a, 'private-hooks');
    await Promise.all([pa.ready, subscribed(b, 'private-hooks').ready]);
    pa.channel.trigger('client-poke', { n: 1 });
    await waitFor(() => seen('client_event', 'private-hooks'), 'client_event');
    expect(seen('client_event', 'private-hooks')).toMatchObject({
      event: 'client-poke',
      data: '{"n":1}',
      socket_id: a.connection.socket_id,
    });

    a.unsubscribe('presence-hooks');
    await waitFor(() => seen('member_removed', 'presence-hooks'), 'member_removed');
    a.unsubscribe('hooked');
    await waitFor(() => seen('channel_vacated', 'hooked'), 'channel_vacated');
    expect(hooks.every((h) => h.valid)).toBe(true);
  });
});

describe('the Pusher HTTP API', () => {
  it('lists channels with counts and answers channel info', async () => {
    const a = client(OPEN, { user_id: 'u1' });
    const b = client(OPEN, { user_id: 'u2' });
    await Promise.all([subscribed(a, 'presence-lobby').ready, subscribed(b, 'presence-lobby').ready]);
    await subscribed(a, 'stocks').ready;

    const all = await apiGet('/channels');
    expect(all.status).toBe(200);
    const names = Object.keys((all.body as { channels: object }).channels);
    expect(names).toEqual(expect.arrayContaining(['presence-lobby', 'stocks']));

    const presence = await apiGet('/channels', { filter_by_prefix: 'presence-', info: 'user_count' });
    expect(presence.body).toEqual({ channels: { 'presence-lobby': { user_count: 2 } } });

    const info = await apiGet('/channels/stocks', { info: 'subscription_count' });
    expect(info.body).toEqual({ occupied: true, subscription_count: 1 });
    const empty = await apiGet('/channels/nobody-here');
    expect(empty.body).toEqual({ occupied: false });

    const bad = await apiGet('/channels', { info: 'user_count' });
    expect(bad.status).toBe(400);
  });

  it('answers 401 to a wrong secret and to a stale timestamp, 404 to an unknown app', async () => {
    const wrong = new PusherServer({
      appId: OPEN.id,
      key: OPEN.key,
      secret: 'wrong',
      host: '127.0.0.1',
      port: String(server.port),
      useTLS: false,
    });
    await expect(wrong.trigger('news', 'x', {})).rejects.toMatchObject({ status: 401 });

    // A request signed correctly 11 minutes ago.
    const realNow = Date.now;
    Date.now = () => realNow() - 11 * 60 * 1000;
    try {
      await expect(backend().trigger('news', 'x', {})).rejects.toMatchObject({ status: 401 });
    } finally {
      Date.now = realNow;
    }

    const unknown = backend({ ...OPEN, id: 'no-such-app' });
    await expect(unknown.trigger('news', 'x', {})).rejects.toMatchObject({ status: 404 });
  });

  it('answers 413 to oversized data and 400 to a bad body', async () => {
    await expect(backend().trigger('news', 'big', 'x'.repeat(11 * 1024))).rejects.toMatchObject({ status: 413 });
    await expect(backend().post({ path: '/events', body: { name: 'x' } as unknown as string })).rejects.toMatchObject({
      status: 400,
    });
  });
});
