// The demo page in a real browser: Debian's Chromium, headless, driven by playwright-core. The page
// is served by `herald serve --dev` itself (the committed demo files are embedded in the binary);
// the browser reaches it through a TCP proxy so the test can also cut the page's connection.
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Browser, launchChromium } from '../support/browser.js';
import { CutProxy } from '../support/proxy.js';
import { HeraldServer, sleep } from '../support/server.js';

const outDir = resolve(__dirname, '..', '..', 'test-output');

let server: HeraldServer;
let proxy: CutProxy;
let browser: Browser;
let page: Page;
const consoleErrors: string[] = [];

beforeAll(async () => {
  mkdirSync(outDir, { recursive: true });
  server = await HeraldServer.start(inject('heraldBin'));
  proxy = await new CutProxy(server.port).start();
  browser = await launchChromium({ width: 1100, height: 720 });
  page = browser.page;
  page.on('console', (m) => {
    if (m.type() === 'error') consoleErrors.push(m.text());
  });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
});

afterAll(async () => {
  await browser?.close();
  await proxy?.stop();
  await server?.stop();
});

const texts = () => page.$$eval('#messages li:not(.system) .text', (els) => els.map((e) => e.textContent));

describe('demo page in Chromium', () => {
  it('serves the page and the SDK bundle', async () => {
    const html = await fetch(`${server.http}/`);
    expect(html.status).toBe(200);
    expect(html.headers.get('content-type')).toMatch(/text\/html/);
    const js = await fetch(`${server.http}/herald.js`);
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toMatch(/javascript/);
  });

  it('connects and shows messages published through the HTTP API', async () => {
    await page.goto(`${proxy.http}/`);
    await page.waitForSelector('#status[data-state="connected"]', { timeout: 15_000 });
    for (let i = 1; i <= 3; i++) await server.publish('chat', { user: 'test', text: `hello from the API ${i}` });
    await page.waitForFunction(() => document.querySelectorAll('#messages li:not(.system)').length >= 3);
    expect(await texts()).toEqual(['hello from the API 1', 'hello from the API 2', 'hello from the API 3']);
  });

  it('sends chat messages from the page', async () => {
    await page.fill('#chat-input', 'typed in the browser');
    await page.press('#chat-input', 'Enter');
    await page.waitForFunction(() => document.querySelectorAll('#messages li:not(.system)').length >= 4);
    expect((await texts()).at(-1)).toBe('typed in the browser');
    const h = await server.api<{ publications: Array<{ data: { text: string } }> }>('/api/history', {
      channel: 'chat',
    });
    expect(h.publications.at(-1)?.data.text).toBe('typed in the browser');
  });

  it('counts clicks on the live counter', async () => {
    await page.click('#increment');
    await page.click('#increment');
    await page.waitForSelector('#counter[data-value="2"]');
    await server.publish('counter', { inc: 5 });
    await page.waitForSelector('#counter[data-value="7"]');
  });

  it('recovers what was published while its connection was cut', async () => {
    await proxy.cut();
    await page.waitForSelector('#status[data-state="connecting"]', { timeout: 10_000 });
    for (let i = 1; i <= 5; i++) {
      await server.publish('chat', { user: 'test', text: `while cut ${i}` });
      await sleep(450);
    }
    await proxy.restore();
    await page.waitForSelector('#status[data-state="connected"]', { timeout: 15_000 });
    await server.publish('chat', { user: 'test', text: 'after the cut' });
    await page.waitForFunction(() => document.querySelectorAll('#messages li:not(.system)').length >= 10);
    await sleep(300);
    expect(await texts()).toEqual([
      'hello from the API 1',
      'hello from the API 2',
      'hello from the API 3',
      'typed in the browser',
      'while cut 1',
      'while cut 2',
      'while cut 3',
      'while cut 4',
      'while cut 5',
      'after the cut',
    ]);
    const offsets = await page.$$eval('#messages li:not(.system)', (els) =>
      els.map((e) => Number((e as HTMLElement).dataset.offset)),
    );
    expect(offsets).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  });

  it('renders without errors (screenshot in test-output/)', async () => {
    await page.screenshot({ path: join(outDir, 'demo.png'), fullPage: true });
    expect(consoleErrors.filter((e) => !/WebSocket connection to .* failed/.test(e))).toEqual([]);
  });
});
