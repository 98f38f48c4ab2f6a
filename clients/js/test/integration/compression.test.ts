// WebSocket compression (permessage-deflate) between the real server and a real client that
// negotiates it: Node's `ws` package, alone and as the SDK's WebSocket (`nodeWebSocket`). The
// server's side (RSV1 rules, bombs, corrupt data) is tested on the wire in
// crates/server/tests/compression.rs; this checks that an independent implementation agrees.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import WebSocket from 'ws';
import { Herald, nodeWebSocket } from '../../src/node.js';
import { HeraldServer, waitFor } from '../support/server.js';

let on: HeraldServer;
let off: HeraldServer;

beforeAll(async () => {
  on = await HeraldServer.start(inject('heraldBin'), { env: { HERALD_LIMITS__COMPRESSION: 'true' } });
  off = await HeraldServer.start(inject('heraldBin'));
});
afterAll(async () => {
  await on?.stop();
  await off?.stop();
});

/** A `ws` client, open; its negotiated extensions and the lines it receives. */
async function open(url: string, perMessageDeflate: boolean) {
  const ws = new WebSocket(url, { perMessageDeflate });
  let answer: string | undefined;
  ws.once('upgrade', (res) => {
    answer = res.headers['sec-websocket-extensions'];
  });
  const lines: unknown[] = [];
  let rsv1Frames = 0;
  ws.on('message', (data) => {
    for (const line of data
      .toString()
      .split('\n')
      .filter((l) => l))
      lines.push(JSON.parse(line));
  });
  // `ws` tells whether a received message was compressed only through its receiver; count RSV1 on
  // the raw socket instead, from the frame headers (server frames are unmasked, lengths < 64 KiB).
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  const socket = (ws as unknown as { _socket: import('node:net').Socket })._socket;
  socket.prependListener('data', (chunk: Buffer) => {
    // Good enough for a test that sends one message at a time: the first byte of a chunk that
    // starts a frame.
    if ((chunk[0] & 0x0f) === 1 && (chunk[0] & 0x40) !== 0) rsv1Frames++;
  });
  return { ws, lines, rsv1: () => rsv1Frames, answer: () => answer };
}

function connect(ws: WebSocket, channel: string) {
  ws.send(JSON.stringify({ id: 1, connect: { subs: { [channel]: {} } } }));
}

describe('permessage-deflate with ws', () => {
  it('is negotiated when the server allows it, and a large publication arrives intact', async () => {
    const c = await open(on.ws, true);
    expect(c.ws.extensions).toBe('permessage-deflate');
    expect(c.answer()).toBe('permessage-deflate; server_no_context_takeover; client_no_context_takeover');
    connect(c.ws, 'deflate');
    await waitFor(() => c.lines.some((l) => (l as { id?: number }).id === 1), 'connect reply');
    const text = Array.from({ length: 3000 }, (_, i) => `row ${i} of a compressible feed`).join('; ');
    await on.publish('deflate', { text });
    await on.publish('deflate', { text, again: true });
    const pubs = () => c.lines.filter((l) => (l as { pub?: unknown }).pub);
    await waitFor(() => pubs().length === 2, 'two publications');
    expect((pubs()[0] as { pub: { data: unknown } }).pub.data).toEqual({ text });
    expect((pubs()[1] as { pub: { data: unknown } }).pub.data).toEqual({ text, again: true });
    expect(c.rsv1()).toBeGreaterThanOrEqual(2);
    c.ws.close();
  });

  it('is not negotiated when the server has it off, or the client does not offer it', async () => {
    const a = await open(off.ws, true);
    expect(a.ws.extensions).toBe('');
    expect(a.answer()).toBeUndefined();
    connect(a.ws, 'plain');
    await waitFor(() => a.lines.length > 0, 'connect reply');
    const big = 'y'.repeat(20_000);
    await off.publish('plain', big);
    await waitFor(() => a.lines.some((l) => (l as { pub?: unknown }).pub), 'publication');
    expect(a.rsv1()).toBe(0);
    a.ws.close();

    const b = await open(on.ws, false);
    expect(b.ws.extensions).toBe('');
    expect(b.answer()).toBeUndefined();
    b.ws.close();
  });

  it('works as the SDK WebSocket (nodeWebSocket)', async () => {
    const client = new Herald(on.ws, { WebSocket: nodeWebSocket({ compression: true }) });
    const got: unknown[] = [];
    const sub = client.subscribe('sdk-deflate', { onPublication: (p) => got.push(p.data) });
    client.connect();
    await sub.ready();
    const data = { rows: Array.from({ length: 500 }, (_, i) => ({ i, name: `row ${i}` })) };
    await on.publish('sdk-deflate', data);
    await waitFor(() => got.length === 1, 'publication through the SDK');
    expect(got[0]).toEqual(data);
    client.disconnect();
  });
});
