// The guarantee, end to end: the client's socket is really cut (a TCP proxy destroys it and refuses
// reconnects) for more than 2 s, repeatedly, while the backend keeps publishing through the HTTP
// API. The app must see every publication exactly once, in order.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Herald, type ConnectionState } from '../../src/node.js';
import { CutProxy } from '../support/proxy.js';
import { commandsOf, recordingWebSocket } from '../support/recording-ws.js';
import { HeraldServer, sleep, waitFor } from '../support/server.js';

let server: HeraldServer;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'));
});
afterAll(async () => {
  await server?.stop();
});

/** Publish n = 1, 2, … to each channel in turn until stopped; returns the counts published. */
function startPublisher(channels: string[], spacingMs = 10) {
  const counts = Object.fromEntries(channels.map((c) => [c, 0])) as Record<string, number>;
  let running = true;
  let failure: unknown;
  const done = (async () => {
    while (running) {
      for (const ch of channels) {
        const n = counts[ch] + 1;
        try {
          await server.publish(ch, { n });
          counts[ch] = n;
        } catch (e) {
          failure = e;
          running = false;
          return;
        }
      }
      await sleep(spacingMs);
    }
  })();
  return {
    counts,
    async stop() {
      running = false;
      await done;
      if (failure) throw failure;
      return counts;
    },
  };
}

describe('delivery across real connection cuts', () => {
  it('delivers every publication exactly once, in order, through repeated 2 s+ cuts', async () => {
    const proxy = await new CutProxy(server.port).start();
    const rec = recordingWebSocket();
    const client = new Herald(proxy.ws, {
      WebSocket: rec.WebSocket,
      minReconnectDelayMs: 200,
      maxReconnectDelayMs: 1000,
    });
    const channels = ['cut-a', 'cut-b'];
    const got: Record<string, number[]> = { 'cut-a': [], 'cut-b': [] };
    const recovered: Record<string, number> = { 'cut-a': 0, 'cut-b': 0 };
    const failed: string[] = [];
    const states: ConnectionState[] = [];
    client.on('state', (s) => states.push(s.newState));
    for (const ch of channels) {
      client.subscribe<{ n: number }>(ch, {
        onPublication: (p) => got[ch].push(p.data.n),
        onSubscribed: (ctx) => {
          if (ctx.recovered) recovered[ch]++;
        },
        onRecoveryFailed: (ctx) => failed.push(ctx.channel),
      });
    }
    client.connect();
    await Promise.all(client.subscriptions().map((s) => s.ready()));

    const publisher = startPublisher(channels);
    const cycles = 3;
    for (let i = 0; i < cycles; i++) {
      await sleep(500);
      const before = Object.values(publisher.counts).reduce((a, b) => a + b, 0);
      await proxy.cut();
      await waitFor(() => client.state === 'connecting', 'the client to notice the cut', 5000);
      await sleep(2200);
      const during = Object.values(publisher.counts).reduce((a, b) => a + b, 0) - before;
      expect(during, 'the backend kept publishing while the socket was cut').toBeGreaterThan(20);
      await proxy.restore();
      await waitFor(() => client.state === 'connected', 'the client to reconnect', 10_000);
    }
    await sleep(300);
    const counts = await publisher.stop();

    for (const ch of channels) {
      const expected = Array.from({ length: counts[ch] }, (_, i) => i + 1);
      await waitFor(() => got[ch].length >= expected.length, `all of ${ch} delivered`, 10_000).catch(() => {});
      expect(got[ch], `${ch}: every publication exactly once, in order`).toEqual(expected);
      expect(recovered[ch], `${ch}: recovered after each cut`).toBe(cycles);
    }
    expect(failed).toEqual([]);
    expect(states.filter((s) => s === 'connected')).toHaveLength(cycles + 1);

    // Each reconnect restored both subscriptions in the `connect` command itself, with `since`,
    // and never needed a separate subscribe.
    const opened = rec.sockets.filter((log) => log.length > 0);
    expect(opened.length).toBe(cycles + 1);
    for (const [i, log] of opened.entries()) {
      const cmds = commandsOf(log);
      expect(Object.keys(cmds[0])).toContain('connect');
      expect(cmds.filter((c) => 'subscribe' in c)).toEqual([]);
      const subs = cmds[0].connect?.subs ?? {};
      expect(Object.keys(subs).sort()).toEqual(channels);
      if (i > 0) {
        for (const ch of channels) {
          expect(subs[ch]?.since).toMatchObject({ epoch: expect.any(String), offset: expect.any(Number) });
        }
      }
    }
    client.disconnect();
    await proxy.stop();
  });

  it('tells the app when history is lost (server restart) and carries on with the new stream', async () => {
    const port = server.port;
    const client = new Herald(server.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
    const got: number[] = [];
    const failed: Array<{ channel: string }> = [];
    const connecting: number[] = [];
    client.on('connecting', (c) => connecting.push(c.code));
    const sub = client.subscribe<{ n: number }>('restart', {
      onPublication: (p) => got.push(p.data.n),
      onRecoveryFailed: (ctx) => failed.push({ channel: ctx.channel }),
    });
    client.connect();
    await sub.ready();
    await server.publish('restart', { n: 1 });
    await waitFor(() => got.length === 1, 'first publication');

    // Graceful restart: in-memory history is gone, so the epoch changes.
    await server.stop('SIGTERM');
    server = await HeraldServer.start(server.bin, { port });
    await waitFor(() => client.state === 'connected', 'reconnect to the restarted server', 20_000);
    await waitFor(() => failed.length === 1, 'onRecoveryFailed');
    expect(failed).toEqual([{ channel: 'restart' }]);
    // Shutdown is announced with close code 4000 (or seen as a plain drop if the frame was lost).
    expect(connecting.some((c) => c === 4000)).toBe(true);

    await server.publish('restart', { n: 2 });
    await waitFor(() => got.length === 2, 'publication on the new stream');
    expect(got).toEqual([1, 2]);
    client.disconnect();
  });
});
