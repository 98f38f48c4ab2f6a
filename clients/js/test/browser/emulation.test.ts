// The SDK in Chromium behind a proxy that refuses WebSocket upgrades (as some corporate proxies
// do): the demo page's own client and one made in the page fall back to WebSocket emulation by
// themselves, publish from the page, and recover exactly once, in order, after a real cut.
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Herald as HeraldClient } from '../../src/index.js';
import { type Browser, launchChromium } from '../support/browser.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, sleep } from '../support/server.js';

let server: HeraldServer;
let proxy: CutProxy;
let browser: Browser;
let page: Page;

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'));
  proxy = await new CutProxy(server.port, { blockWebSocket: true }).start();
  browser = await launchChromium();
  page = browser.page;
});

afterAll(async () => {
  await browser?.close();
  await proxy?.stop();
  await server?.stop();
});

type Seen = { got: number[]; transports: string[] };
const seen = () => page.evaluate(() => (window as unknown as { seen: Seen }).seen);

describe('SDK in Chromium with WebSocket blocked', () => {
  it('falls back to emulation and delivers exactly once across a cut', async () => {
    await page.goto(`${proxy.http}/`);
    // The demo page's client falls back by itself.
    await page.waitForSelector('#status[data-state="connected"]', { timeout: 15_000 });
    expect(proxy.blockedUpgrades).toBeGreaterThan(0);

    await page.evaluate(async () => {
      // The demo page's client is a Herald: its constructor makes ours (an import() here would be
      // rewritten by the test bundler).
      const Herald = (window as unknown as { herald: { constructor: unknown } }).herald
        .constructor as typeof HeraldClient;
      const seen = { got: [] as number[], transports: [] as string[] };
      (window as unknown as { seen: typeof seen }).seen = seen;
      const client = new Herald(`ws://${location.host}/ws`, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
      client.on('connected', (ctx) => seen.transports.push(ctx.transport));
      const sub = client.subscribe('emu-browser', {
        onPublication: (p) => seen.got.push((p.data as { n: number }).n),
      });
      client.connect();
      await sub.ready();
      await client.publish('emu-browser', { n: 1 });
      (window as unknown as { client: typeof client }).client = client;
    });
    for (let n = 2; n <= 3; n++) await server.publish('emu-browser', { n });
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.got.length === 3);

    await proxy.cut();
    await page.waitForFunction(
      () => (window as unknown as { client: { state: string } }).client.state === 'connecting',
    );
    for (let n = 4; n <= 6; n++) await server.publish('emu-browser', { n });
    await sleep(300);
    await proxy.restore();
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.transports.length >= 2, undefined, {
      timeout: 15_000,
    });
    await server.publish('emu-browser', { n: 7 });
    await page.waitForFunction(() => (window as unknown as { seen: Seen }).seen.got.length >= 7, undefined, {
      timeout: 15_000,
    });
    await sleep(200);
    const s = await seen();
    expect(s.got).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(new Set(s.transports)).toEqual(new Set(['emulation']));
  });
});
