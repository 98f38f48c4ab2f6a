// Laravel Echo with its Pusher connector (and the browser build of pusher-js) in headless
// Chromium against the real server; channel authorizations come from the official `pusher` SDK
// in Node, exposed to the page as Laravel's /broadcasting/auth would answer.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import PusherServer from 'pusher';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { HeraldServer, waitFor } from '../support/server.js';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
// A numeric app id, as the docs use (the Python SDK accepts nothing else).
const APP = { id: '1001', key: 'echo-key', secret: 'echo-secret' };
const modules = resolve(__dirname, '..', '..', 'node_modules');

let server: HeraldServer;
let context: BrowserContext;
let page: Page;
let profile: string;
let backend: PusherServer;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'), {
    env: {
      HERALD_PUSHER_APP_ID: APP.id,
      HERALD_PUSHER_APP_KEY: APP.key,
      HERALD_PUSHER_APP_SECRET: APP.secret,
      HERALD_PUSHER_APP_ENABLE_CLIENT_EVENTS: 'true',
    },
  });
  backend = new PusherServer({
    appId: APP.id,
    key: APP.key,
    secret: APP.secret,
    host: '127.0.0.1',
    port: String(server.port),
    useTLS: false,
  });
  profile = mkdtempSync(join(tmpdir(), 'herald-chromium-'));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
  });
  page = context.pages()[0] ?? (await context.newPage());
  // What a Laravel app's /broadcasting/auth answers, signed by the official server SDK.
  await page.exposeFunction('authorize', (socketId: string, channel: string, user: string) =>
    backend.authorizeChannel(
      socketId,
      channel,
      channel.startsWith('presence-') ? { user_id: user, user_info: { name: user } } : undefined,
    ),
  );
  await page.addScriptTag({ path: join(modules, 'pusher-js/dist/web/pusher.min.js') });
  await page.addScriptTag({ path: join(modules, 'laravel-echo/dist/echo.iife.js') });
  await page.evaluate(
    ({ key, port }) => {
      type Auth = (socketId: string, channel: string, user: string) => Promise<unknown>;
      const w = window as unknown as Record<string, unknown>;
      const EchoClass = (w.Echo as { default: new (o: unknown) => unknown }).default;
      w.got = [] as unknown[];
      w.echo = (user: string) =>
        new EchoClass({
          broadcaster: 'pusher',
          key,
          cluster: 'mt1',
          wsHost: '127.0.0.1',
          wsPort: port,
          forceTLS: false,
          enabledTransports: ['ws'],
          disableStats: true,
          channelAuthorization: {
            endpoint: '/broadcasting/auth',
            transport: 'ajax',
            customHandler: (
              params: { socketId: string; channelName: string },
              done: (e: unknown, a: unknown) => void,
            ) => {
              (w.authorize as Auth)(params.socketId, params.channelName, user).then((a) => done(null, a));
            },
          },
        });
    },
    { key: APP.key, port: server.port },
  );
});

afterAll(async () => {
  await context?.close().catch(() => {});
  await server?.stop();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

const got = () => page.evaluate(() => (window as unknown as { got: unknown[] }).got);

describe('Laravel Echo (Pusher connector) in Chromium', () => {
  it('receives a broadcast on a public channel', async () => {
    await page.evaluate(() => {
      const w = window as unknown as Record<string, unknown>;
      type Echo = { channel: (n: string) => { listen: (e: string, f: (d: unknown) => void) => unknown } };
      const a = (w.echo as (u: string) => Echo)('alice');
      w.alice = a;
      a.channel('orders').listen('.OrderShipped', (e) => (w.got as unknown[]).push(['public', e]));
    });
    await waitFor(async () => {
      await backend.trigger('orders', 'OrderShipped', { id: 1 });
      await new Promise((r) => setTimeout(r, 200));
      return (await got()).length > 0;
    }, 'the broadcast');
    expect((await got())[0]).toEqual(['public', { id: 1 }]);
  });

  it("hears Laravel's default event names (App\\Events\\…) and keeps toOthers() from the sender", async () => {
    // `.listen('OrderShipped')` with Echo's default namespace waits for `App\Events\OrderShipped`,
    // the name Laravel broadcasts; `toOthers()` sends the sender's socket id as `socket_id`.
    const socketId = await page.evaluate(async () => {
      const w = window as unknown as Record<string, unknown>;
      type Echo = {
        channel: (n: string) => { listen: (e: string, f: (d: unknown) => void) => unknown };
        socketId: () => string | undefined;
      };
      const push = (x: unknown) => (w.got as unknown[]).push(x);
      const sender = (w.echo as (u: string) => Echo)('dave');
      const other = (w.echo as (u: string) => Echo)('erin');
      sender.channel('shipments').listen('OrderShipped', (e) => push(['sender', e]));
      other.channel('shipments').listen('OrderShipped', (e) => push(['other', e]));
      for (let i = 0; i < 150 && !sender.socketId(); i++) await new Promise((r) => setTimeout(r, 100));
      return sender.socketId();
    });
    expect(socketId).toMatch(/^\d+\.\d+$/);
    const heard = async () => ((await got()) as unknown[][]).filter((x) => x[0] === 'sender' || x[0] === 'other');
    await waitFor(async () => {
      await backend.trigger('shipments', 'App\\Events\\OrderShipped', { id: 2 }, { socket_id: socketId });
      await new Promise((r) => setTimeout(r, 200));
      return (await heard()).length > 0;
    }, 'App\\Events\\OrderShipped');
    await new Promise((r) => setTimeout(r, 300));
    const events = await heard();
    expect(events[0]).toEqual(['other', { id: 2 }]);
    expect(events.filter((x) => x[0] === 'sender')).toEqual([]);
  });

  it('joins a presence channel, sees members join, and relays whispers on a private channel', async () => {
    await page.evaluate(() => {
      const w = window as unknown as Record<string, unknown>;
      const push = (x: unknown) => (w.got as unknown[]).push(x);
      type Chan = {
        here: (f: (u: unknown) => void) => Chan;
        joining: (f: (u: unknown) => void) => Chan;
        listenForWhisper: (e: string, f: (d: unknown) => void) => Chan;
        subscribed: (f: () => void) => Chan;
        whisper: (e: string, d: unknown) => Chan;
      };
      type Echo = { join: (n: string) => Chan; private: (n: string) => Chan };
      const a = w.alice as Echo;
      const b = (w.echo as (u: string) => Echo)('bob');
      w.bob = b;
      // Bob joins once alice is in (her `here`): joining at the same moment, he could be in
      // the member list she gets instead of a `joining` event.
      a.join('room')
        .here((users) => {
          push(['here', users]);
          b.join('room');
        })
        .joining((user) => push(['joining', user]));
      a.private('chat').listenForWhisper('typing', (d) => push(['whisper', d]));
      const chat = b.private('chat');
      chat.subscribed(() => {
        // Whisper until alice hears it (her subscription may still be on its way).
        const timer = setInterval(() => {
          if ((w.got as unknown[][]).some((x) => x[0] === 'whisper')) clearInterval(timer);
          else chat.whisper('typing', { who: 'bob' });
        }, 100);
      });
    });
    await waitFor(async () => (await got()).some((x) => (x as unknown[])[0] === 'joining'), 'joining');
    await waitFor(async () => (await got()).some((x) => (x as unknown[])[0] === 'whisper'), 'whisper');
    const events = (await got()) as unknown[][];
    expect(events.find((x) => x[0] === 'here')).toEqual(['here', [{ name: 'alice' }]]);
    expect(events.find((x) => x[0] === 'joining')).toEqual(['joining', { name: 'bob' }]);
    expect(events.find((x) => x[0] === 'whisper')).toEqual(['whisper', { who: 'bob' }]);
  });
});
