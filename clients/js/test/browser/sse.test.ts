// Server-Sent Events in a real browser: Chromium's own EventSource against `herald serve --dev`
// (the page is the node's demo page, so the stream is same-origin), through a TCP proxy that
// cuts the connection. The browser reconnects by itself and sends Last-Event-ID; the node must
// replay exactly what was missed, once, in order.
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Browser, launchChromium } from '../support/browser.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, sleep } from '../support/server.js';

let server: HeraldServer;
let proxy: CutProxy;
let browser: Browser;
let page: Page;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'));
  proxy = await new CutProxy(server.port).start();
  browser = await launchChromium();
  page = browser.page;
});

afterAll(async () => {
  await browser?.close();
  await proxy?.stop();
  await server?.stop();
});

type Seen = { offsets: number[]; ids: string[]; opens: number };
const seen = () => page.evaluate(() => (window as unknown as { seen: Seen }).seen);

describe('EventSource in Chromium', () => {
  it('receives publications and resumes with Last-Event-ID after a cut, exactly once', async () => {
    await page.goto(`${proxy.http}/`);
    await page.evaluate(() => {
      const seen = { offsets: [] as number[], ids: [] as string[], opens: 0 };
      (window as unknown as { seen: typeof seen }).seen = seen;
      const es = new EventSource('/connection/sse?channel=sse-feed');
      es.onopen = () => seen.opens++;
      es.onmessage = (e) => {
        seen.offsets.push(JSON.parse(e.data).offset);
        seen.ids.push(e.lastEventId);
      };
    });
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.opens === 1);
    for (let i = 1; i <= 3; i++) await server.publish('sse-feed', { i });
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.offsets.length === 3);

    await proxy.cut();
    for (let i = 4; i <= 6; i++) await server.publish('sse-feed', { i });
    await sleep(500);
    await proxy.restore();
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.opens >= 2, undefined, {
      timeout: 15_000,
    });
    await server.publish('sse-feed', { i: 7 });
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.offsets.length >= 7, undefined, {
      timeout: 15_000,
    });
    await sleep(300);
    const s = await seen();
    expect(s.offsets).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(s.ids.at(-1)).toMatch(/^[0-9a-f]+:7$/);
  });
});
