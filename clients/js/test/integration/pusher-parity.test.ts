// Pusher parity features with the real npm clients against the real server: cache channels
// (the last event, or pusher:cache_miss, as pusher-js reports them), subscription counting
// (pusher-js's `pusher:subscription_count` and `channel.subscriptionCount`), and the `info`
// attributes that `trigger` / `triggerBatch` of the official `pusher` server SDK ask for, and
// watchlist events (pusher-js's `pusher.user.watchlist`, users signed in through the SDK's
// `authenticateUser` with a `watchlist`).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import PusherServer from 'pusher';
import Pusher from 'pusher-js';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { HeraldServer, sleep, waitFor } from '../support/server.js';

const COUNTED = { id: '301', key: 'key-counted', secret: 'secret-counted' };
const PLAIN = { id: '302', key: 'key-plain', secret: 'secret-plain' };
const WATCHING = { id: '303', key: 'key-watching', secret: 'secret-watching' };
type App = typeof COUNTED;

let server: HeraldServer;
let dir: string;
const clients: Pusher[] = [];

function backend(app: App = COUNTED): PusherServer {
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
function client(app: App = COUNTED, presence?: { user_id: string }): Pusher {
  const signing = backend(app);
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

/** Subscribe and record every event of the channel (pusher-js's bind_global), in order. */
function recorded(c: Pusher, name: string) {
  const channel = c.subscribe(name);
  const events: Array<{ event: string; data: unknown }> = [];
  channel.bind_global((event: string, data: unknown) => events.push({ event, data }));
  const ready = waitFor(() => events.some((e) => e.event === 'pusher:subscription_succeeded'), `${name} subscribed`);
  return { channel, events, ready };
}

type WatchlistEvent = { name: string; user_ids: string[] };

/** A pusher-js client of `app` signed in as `id` (the server SDK signs its `user_data`, with the
 * watchlist when given), recording what `pusher.user.watchlist` reports. */
function signedIn(id: string, watchlist?: string[], app: App = WATCHING) {
  const signing = backend(app);
  const c = new Pusher(app.key, {
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
        const user = watchlist ? { id, watchlist } : { id };
        callback(null, signing.authenticateUser(params.socketId, user));
      },
    },
  });
  clients.push(c);
  const events: WatchlistEvent[] = [];
  c.user.watchlist.bind('online', (e: WatchlistEvent) => events.push(e));
  c.user.watchlist.bind('offline', (e: WatchlistEvent) => events.push(e));
  c.signin();
  const ready = c.user.signinDonePromise;
  return { c, events, ready };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'herald-pusher-parity-'));
  const config = join(dir, 'herald.toml');
  writeFileSync(
    config,
    `[[pusher.apps]]
id = "${COUNTED.id}"
key = "${COUNTED.key}"
secret = "${COUNTED.secret}"
enable_subscription_count = true

[[pusher.apps]]
id = "${PLAIN.id}"
key = "${PLAIN.key}"
secret = "${PLAIN.secret}"

[[pusher.apps]]
id = "${WATCHING.id}"
key = "${WATCHING.key}"
secret = "${WATCHING.secret}"
enable_watchlist_events = true
`,
  );
  server = await HeraldServer.start(inject('heraldBin'), { args: ['--config', config] });
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('Pusher parity with pusher-js and the pusher server SDK', () => {
  it('cache channels: pusher:cache_miss when empty, then the last event first to a new subscriber', async () => {
    const first = recorded(client(PLAIN), 'cache-score');
    await first.ready;
    await waitFor(() => first.events.some((e) => e.event === 'pusher:cache_miss'), 'pusher:cache_miss');

    await backend(PLAIN).trigger('cache-score', 'score', { home: 1 });
    await backend(PLAIN).trigger('cache-score', 'score', { home: 2 });
    await waitFor(() => first.events.filter((e) => e.event === 'score').length === 2, 'both live events');

    const late = recorded(client(PLAIN), 'cache-score');
    await waitFor(() => late.events.some((e) => e.event === 'score'), 'the cached event');
    await sleep(200);
    expect(late.events.map((e) => e.event)).toEqual(['pusher:subscription_succeeded', 'score']);
    expect(late.events[1].data).toEqual({ home: 2 });

    // A private cache channel, authorized through the SDK's signature.
    await backend(PLAIN).trigger('private-cache-door', 'state', { open: true });
    const door = recorded(client(PLAIN), 'private-cache-door');
    await waitFor(() => door.events.some((e) => e.event === 'state'), 'the cached private event');
    expect(door.events.find((e) => e.event === 'state')?.data).toEqual({ open: true });
  });

  it('subscription counting: pusher:subscription_count and channel.subscriptionCount follow the count', async () => {
    const a = client();
    const sa = recorded(a, 'room');
    await sa.ready;
    const counts = (r: typeof sa) =>
      r.events
        .filter((e) => e.event === 'pusher:subscription_count')
        .map((e) => (e.data as { subscription_count: number }).subscription_count);
    await waitFor(() => counts(sa).at(-1) === 1, 'count 1');

    const sb = recorded(client(), 'room');
    await waitFor(() => counts(sb).at(-1) === 2, 'the new subscriber is told 2');
    await waitFor(() => counts(sa).at(-1) === 2, 'the first is told 2');
    expect((sa.channel as unknown as { subscriptionCount: number }).subscriptionCount).toBe(2);

    clients[1].unsubscribe('room');
    await waitFor(() => counts(sa).at(-1) === 1, 'back to 1');

    // An app without subscription counting sends none.
    const plain = recorded(client(PLAIN), 'room');
    await plain.ready;
    await sleep(500);
    expect(counts(plain)).toEqual([]);
  });

  it('trigger and triggerBatch with info answer the channels attributes', async () => {
    const alice = client(COUNTED, { user_id: 'alice' });
    const p = recorded(alice, 'presence-lobby');
    const n = recorded(alice, 'news');
    await Promise.all([p.ready, n.ready]);

    const r = await backend().trigger(
      ['presence-lobby', 'news'],
      'hello',
      { x: 1 },
      {
        info: 'user_count,subscription_count',
      },
    );
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({
      channels: {
        'presence-lobby': { user_count: 1, subscription_count: 1 },
        news: { subscription_count: 1 },
      },
    });

    const batch = await backend().triggerBatch([
      { channel: 'news', name: 'hello', data: {}, info: 'subscription_count' },
      { channel: 'presence-lobby', name: 'hello', data: {}, info: 'user_count' },
    ]);
    expect(await batch.json()).toEqual({ batch: [{ subscription_count: 1 }, { user_count: 1 }] });
  });
});

describe('watchlist events with pusher-js', () => {
  it('pusher.user.watchlist reports watched users online, then online and offline as they change', async () => {
    const alice = signedIn('alice');
    await alice.ready;
    const watcher = signedIn('watcher', ['alice', 'bob']);
    await waitFor(() => watcher.events.length === 1, 'the watched users online at sign-in');
    expect(watcher.events[0]).toEqual({ name: 'online', user_ids: ['alice'] });

    const bob = signedIn('bob');
    await waitFor(() => watcher.events.length === 2, 'bob online');
    expect(watcher.events[1]).toEqual({ name: 'online', user_ids: ['bob'] });

    alice.c.disconnect();
    await waitFor(() => watcher.events.length === 3, 'alice offline');
    expect(watcher.events[2]).toEqual({ name: 'offline', user_ids: ['alice'] });
    bob.c.disconnect();
    await waitFor(() => watcher.events.length === 4, 'bob offline');
    expect(watcher.events[3]).toEqual({ name: 'offline', user_ids: ['bob'] });

    // An app without watchlist events reports nothing.
    const plainAlice = signedIn('alice', undefined, PLAIN);
    await plainAlice.ready;
    const plainWatcher = signedIn('watcher', ['alice'], PLAIN);
    await plainWatcher.ready;
    await sleep(500);
    expect(plainWatcher.events).toEqual([]);
  });
});
