// WebSocket compression in a real browser: Chromium offers permessage-deflate on every WebSocket by
// itself, so a page (or the SDK in it) needs nothing to get it. Against a node with
// `limits.compression` on, the extension is negotiated and large publications, which the node
// then sends compressed, arrive intact; against a node with it off (the default), it is not.
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Browser, launchChromium } from '../support/browser.js';
import { HeraldServer } from '../support/server.js';

let on: HeraldServer;
let off: HeraldServer;
let browser: Browser;
let page: Page;

beforeAll(async () => {
  on = await HeraldServer.start(inject('heraldBin'), { env: { HERALD_LIMITS__COMPRESSION: 'true' } });
  off = await HeraldServer.start(inject('heraldBin'));
  browser = await launchChromium();
  page = browser.page;
});

afterAll(async () => {
  await browser?.close();
  await on?.stop();
  await off?.stop();
});

type Opened = { extensions: string; lines: unknown[] };

/** Open a WebSocket from the node's own page, connect and subscribe to `channel`. */
async function openIn(server: HeraldServer, channel: string): Promise<void> {
  await page.goto(`${server.http}/`);
  await page.evaluate(
    ([url, ch]) =>
      new Promise<void>((resolve, reject) => {
        const state = { extensions: '', lines: [] as unknown[] };
        (window as unknown as { opened: typeof state }).opened = state;
        const ws = new WebSocket(url);
        ws.onerror = () => reject(new Error('websocket error'));
        ws.onopen = () => {
          state.extensions = ws.extensions;
          ws.send(JSON.stringify({ id: 1, connect: { subs: { [ch]: {} } } }));
        };
        ws.onmessage = (e) => {
          for (const line of String(e.data).split('\n')) {
            if (!line) continue;
            const m = JSON.parse(line);
            state.lines.push(m);
            if (m.id === 1) resolve();
          }
        };
      }),
    [server.ws, channel] as const,
  );
}

const opened = () => page.evaluate(() => (window as unknown as { opened: Opened }).opened);

describe('permessage-deflate in Chromium', () => {
  it('is negotiated by the browser itself, and large publications arrive intact', async () => {
    await openIn(on, 'browser-deflate');
    expect((await opened()).extensions).toBe(
      'permessage-deflate; server_no_context_takeover; client_no_context_takeover',
    );
    const text = Array.from({ length: 2000 }, (_, i) => `line ${i} of a compressible page`).join('\n');
    await on.publish('browser-deflate', { text });
    await page.waitForFunction(() =>
      (window as unknown as { opened: Opened }).opened.lines.some((l) => (l as { pub?: unknown }).pub),
    );
    const pub = (await opened()).lines.find((l) => (l as { pub?: unknown }).pub) as { pub: { data: unknown } };
    expect(pub.pub.data).toEqual({ text });
  });

  it('is not negotiated when the node has it off', async () => {
    await openIn(off, 'browser-plain');
    expect((await opened()).extensions).toBe('');
  });
});
