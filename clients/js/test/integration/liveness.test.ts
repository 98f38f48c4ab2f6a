// Dead-connection detection against the real server: the network path goes silent (a proxy stops
// forwarding without closing anything); the client notices missing pings, drops the socket,
// reconnects and recovers what was published meanwhile.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { ClientCode, Herald } from '../../src/node.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, waitFor } from '../support/server.js';

let server: HeraldServer;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'), { env: { HERALD_PING_INTERVAL: '1' } });
});
afterAll(async () => {
  await server?.stop();
});

describe('missing pings', () => {
  it('closes a silent connection, reconnects and recovers', async (ctx) => {
    const proxy = await new CutProxy(server.port).start();
    const client = new Herald(proxy.ws, { pingGraceMs: 1000, minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
    let pingInterval = 0;
    client.on('connected', (c) => (pingInterval = c.pingInterval));
    const reasons: number[] = [];
    client.on('connecting', (c) => reasons.push(c.code));
    const got: number[] = [];
    const sub = client.subscribe<{ n: number }>('silent', { onPublication: (p) => got.push(p.data.n) });
    client.connect();
    await sub.ready();
    if (pingInterval > 3) {
      client.disconnect();
      await proxy.stop();
      console.warn(
        `liveness test skipped: server ping_interval is ${pingInterval} s, HERALD_PING_INTERVAL=1 was ignored`,
      );
      ctx.skip(); // waiting 25 s+ for pings is not worth it here
    }
    // Prove pings are answered: stay connected over several intervals.
    await new Promise((r) => setTimeout(r, pingInterval * 3000));
    expect(client.state).toBe('connected');
    expect(reasons).toEqual([ClientCode.ConnectCalled]);

    proxy.blackhole();
    await server.publish('silent', { n: 1 });
    await server.publish('silent', { n: 2 });
    await waitFor(
      () => reasons.includes(ClientCode.NoPing),
      'the client to give up on the silent socket',
      pingInterval * 1000 + 5000,
    );
    await waitFor(() => client.state === 'connected', 'reconnect');
    await waitFor(() => got.length === 2, 'recovered publications');
    expect(got).toEqual([1, 2]);
    client.disconnect();
    await proxy.stop();
  });
});
