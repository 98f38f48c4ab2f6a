// Delta compression through the SDK's public API (`subscribe(channel, { delta: 'fossil' })`)
// against the real server: the app sees every publication whole while the socket carries Fossil
// deltas, and after a real connection cut the missed publications are recovered in full and deltas
// resume. A `ws` WebSocket counts what came on the wire, so the test also fails if the server
// stopped sending deltas (the app would still see whole data).
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import WS from 'ws';
import { Herald } from '../../src/node.js';
import type { WebSocketConstructor } from '../../src/transport.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, waitFor } from '../support/server.js';

let server: HeraldServer;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'), {
    env: { HERALD_DEFAULT_NAMESPACE__ALLOW_DELTA: 'true' },
  });
});
afterAll(async () => {
  await server?.stop();
});

/** A ~2 KB order book; each `seq` changes a few fields (one level's size, the sequence, the time). */
function book(seq: number) {
  const level = (side: number, i: number) => ({
    price: `${100 + side * 2 - Math.floor(i / 10)}.${String((i * 7) % 100).padStart(2, '0')}`,
    size: i === seq % 20 ? 1000 + seq : 10 * (i + 1),
    orders: (i % 7) + 1,
  });
  return {
    symbol: 'HRLD-USD',
    seq,
    ts: 1_700_000_000_000 + seq * 250,
    bids: Array.from({ length: 25 }, (_, i) => level(0, i)),
    asks: Array.from({ length: 25 }, (_, i) => level(1, i)),
  };
}

/** A `ws` WebSocket that counts the live publications received as deltas and in full text form. */
function countingWebSocket() {
  const wire = { deltas: 0, fulls: 0 };
  class CountingWebSocket extends WS {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols);
      this.on('message', (data) => {
        for (const line of data.toString().split('\n')) {
          if (!line) continue;
          const pub = (JSON.parse(line) as { pub?: { delta?: boolean } }).pub;
          if (pub?.delta === true) wire.deltas++;
          if (pub?.delta === false) wire.fulls++;
        }
      });
    }
  }
  return { WebSocket: CountingWebSocket as unknown as WebSocketConstructor, wire };
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

describe('delta compression through the SDK', () => {
  it('gives the app every publication whole while the wire carries deltas', async () => {
    const counting = countingWebSocket();
    const client = new Herald(server.ws, { WebSocket: counting.WebSocket });
    const got: unknown[] = [];
    const sub = client.subscribe('delta-book', { delta: 'fossil', onPublication: (p) => got.push(p.data) });
    client.connect();
    await sub.ready();
    for (const seq of range(1, 30)) await server.publish('delta-book', book(seq));
    await waitFor(() => got.length === 30, 'thirty publications through the SDK');
    expect(got).toEqual(range(1, 30).map(book));
    expect(counting.wire).toEqual({ fulls: 1, deltas: 29 });
    client.disconnect();
  });

  it('recovers what was missed during a cut in full, then resumes deltas', async () => {
    const proxy = await new CutProxy(server.port).start();
    const counting = countingWebSocket();
    const client = new Herald(proxy.ws, {
      WebSocket: counting.WebSocket,
      minReconnectDelayMs: 100,
      maxReconnectDelayMs: 300,
    });
    const got: unknown[] = [];
    const recovered: boolean[] = [];
    const failed: string[] = [];
    const sub = client.subscribe('delta-cut', {
      delta: 'fossil',
      onPublication: (p) => got.push(p.data),
      onSubscribed: (ctx) => recovered.push(ctx.recovered),
      onRecoveryFailed: (ctx) => failed.push(ctx.channel),
    });
    client.connect();
    await sub.ready();
    for (const seq of range(1, 5)) await server.publish('delta-cut', book(seq));
    await waitFor(() => got.length === 5, 'five publications before the cut');

    await proxy.cut();
    await waitFor(() => client.state === 'connecting', 'the client to notice the cut', 5000);
    for (const seq of range(6, 10)) await server.publish('delta-cut', book(seq));
    await proxy.restore();
    await waitFor(() => got.length === 10, 'the missed publications recovered', 10_000);
    expect(recovered).toEqual([false, true]);

    for (const seq of range(11, 15)) await server.publish('delta-cut', book(seq));
    await waitFor(() => got.length === 15, 'live publications after the recovery');
    expect(got).toEqual(range(1, 15).map(book));
    expect(failed).toEqual([]);
    // Before the cut: one full, four deltas; after it: 6–10 recovered in full (not text form), then
    // one full and four deltas again.
    expect(counting.wire).toEqual({ fulls: 2, deltas: 8 });
    client.disconnect();
    await proxy.stop();
  });
});
