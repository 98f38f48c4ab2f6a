// WebSocket emulation (SSE down, POST up) from Node against the real server: the SDK's whole API
// works over it, a proxy that refuses WebSocket upgrades makes 'auto' fall back to it, and a cut
// connection recovers exactly once, in order, as over WebSocket.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Herald } from '../../src/node.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, sleep, waitFor } from '../support/server.js';

let server: HeraldServer;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'));
});
afterAll(async () => {
  await server?.stop();
});

describe('WebSocket emulation', () => {
  it('carries subscribe, publish, history and presence', async () => {
    const client = new Herald(server.ws, { transport: 'emulation', name: 'emulated' });
    const transports: string[] = [];
    client.on('connected', (ctx) => transports.push(ctx.transport));
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('emu-api', { onPublication: (p) => got.push(p.data.n) });
    client.connect();
    await sub.ready();
    expect(transports).toEqual(['emulation']);
    await server.publish('emu-api', { n: 1 });
    await client.publish('emu-api', { n: 2 });
    await waitFor(() => got.length === 2, 'two publications');
    expect(got).toEqual([1, 2]);
    const h = await client.history('emu-api');
    expect(h.publications.map((p) => p.offset)).toEqual([1, 2]);
    const p = await client.presence('emu-api');
    expect(Object.keys(p.clients)).toHaveLength(1);
    client.disconnect();
  });

  it("falls back from a blocked WebSocket in 'auto' and recovers across cuts exactly once", async () => {
    const proxy = await new CutProxy(server.port, { blockWebSocket: true }).start();
    const client = new Herald(proxy.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
    const transports: string[] = [];
    client.on('connected', (ctx) => transports.push(ctx.transport));
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('emu-cut', { onPublication: (p) => got.push(p.data.n) });
    client.connect();
    await sub.ready();
    expect(proxy.blockedUpgrades).toBeGreaterThan(0);
    for (let n = 1; n <= 3; n++) await server.publish('emu-cut', { n });
    await waitFor(() => got.length === 3, 'three publications');

    await proxy.cut();
    await waitFor(() => client.state === 'connecting', 'the cut noticed');
    for (let n = 4; n <= 6; n++) await server.publish('emu-cut', { n });
    await sleep(300);
    await proxy.restore();
    await waitFor(() => client.state === 'connected', 'reconnected');
    await server.publish('emu-cut', { n: 7 });
    await waitFor(() => got.length >= 7, 'seven publications');
    await sleep(200);
    expect(got).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(new Set(transports)).toEqual(new Set(['emulation']));
    expect(transports.length).toBeGreaterThanOrEqual(2);
    client.disconnect();
    await proxy.stop();
  });
});
