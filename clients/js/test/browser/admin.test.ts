// The admin UI (/admin, served by the binary) in headless Chromium against a real cluster: three
// `herald` nodes sharing a real redis-server, all on free loopback ports, started and stopped
// here. The browser reaches node 1 only and must see every node; SDK clients connect to the
// other nodes. Screenshots go to test-output/admin/ (not committed).
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { connect } from 'node:net';
import { join, resolve } from 'node:path';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Herald } from '../../src/node.js';
import { type Browser, launchChromium } from '../support/browser.js';
import { signHS256 } from '../support/jwt.js';
import { freePort, HeraldServer, waitFor } from '../support/server.js';

const outDir = resolve(__dirname, '..', '..', 'test-output', 'admin');
const PASSWORD = 'admin-test-password';
const SECRET = 'admin-test-hmac-secret';
const NAMES = ['admin-n1', 'admin-n2', 'admin-n3'];

let redis: ChildProcess | undefined;
const nodes: HeraldServer[] = [];
const clients: Herald[] = [];
let browser: Browser;
let page: Page;
const pageErrors: string[] = [];

function redisUp(port: number): Promise<boolean> {
  return new Promise((r) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      r(true);
    });
    s.once('error', () => r(false));
  });
}

function client(node: HeraldServer, user?: string): Herald {
  const token = user ? signHS256({ sub: user }, SECRET) : undefined;
  const c = new Herald(node.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500, ...(token ? { token } : {}) });
  clients.push(c);
  return c;
}

const shot = (name: string) => page.screenshot({ path: join(outDir, `${name}.png`), fullPage: true });

beforeAll(async () => {
  mkdirSync(outDir, { recursive: true });
  const redisPort = await freePort();
  redis = spawn(
    'redis-server',
    ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    {
      stdio: 'ignore',
    },
  );
  await waitFor(() => redisUp(redisPort), `redis-server on port ${redisPort}`, 10_000, 50);
  for (const name of NAMES) {
    nodes.push(
      await HeraldServer.start(inject('heraldBin'), {
        env: {
          HERALD_BROKER_URL: `redis://127.0.0.1:${redisPort}`,
          HERALD_NODE_NAME: name,
          HERALD_ADMIN__PASSWORD: PASSWORD,
          HERALD_TOKEN_HMAC_SECRET: SECRET,
        },
      }),
    );
  }
  browser = await launchChromium({ width: 1280, height: 900 });
  page = browser.page;
  page.on('pageerror', (e) => pageErrors.push(String(e)));
});

afterAll(async () => {
  for (const c of clients) c.disconnect();
  await browser?.close();
  for (const n of nodes) await n.stop();
  redis?.kill('SIGKILL');
});

/** The connections column of each node's row, by node name. */
const connectionsByNode = () =>
  page.$$eval('#nodes tbody tr', (rows) =>
    Object.fromEntries(
      rows.map((r) => [(r as HTMLElement).dataset.node, r.querySelector('td.connections')?.textContent]),
    ),
  );

describe('admin UI against a three-node Redis cluster', () => {
  it('refuses a wrong password, then logs in', async () => {
    await page.goto(`${nodes[0].http}/admin/`);
    await page.waitForSelector('#login-form', { state: 'visible' });
    await page.fill('#password', 'not-the-password');
    await page.click('#login-form button[type=submit]');
    await page.waitForFunction(() => document.querySelector('#login-error')?.textContent?.includes('wrong'));
    expect(await page.isVisible('#tabs')).toBe(false);
    await shot('login-refused');
    await page.fill('#password', PASSWORD);
    await page.click('#login-form button[type=submit]');
    await page.waitForSelector('#view-overview', { state: 'visible' });
    expect(pageErrors).toEqual([]);
  });

  it('shows all three nodes with their connection counts', async () => {
    // 1 connection on node 1, 2 (both alice's) on node 2, 3 on node 3.
    const plan: Array<[number, string | undefined]> = [
      [0, undefined],
      [1, 'alice'],
      [1, 'alice'],
      [2, undefined],
      [2, 'bob'],
      [2, undefined],
    ];
    for (const [i, user] of plan) {
      const c = client(nodes[i], user);
      c.connect();
      await c.ready();
    }
    const want = { 'admin-n1': '1', 'admin-n2': '2', 'admin-n3': '3' };
    await waitFor(
      async () => JSON.stringify(await connectionsByNode()) === JSON.stringify(want),
      `node rows ${JSON.stringify(want)}`,
      15_000,
      200,
    );
    expect(await page.textContent('#total-connections')).toBe('6');
    expect(await page.textContent('#nodes-note')).toBe('3 nodes');
    // Let the charts draw a few seconds of the cluster's totals.
    await page.waitForFunction(() => document.querySelector('[data-last="connections"]')?.textContent === '6');
    await shot('overview');
  });

  it('publishes from the console to a subscriber on another node', async () => {
    const sub = client(nodes[2]);
    const got: unknown[] = [];
    const s = sub.subscribe('admin-room', { onPublication: (p) => got.push(p.data) });
    sub.connect();
    await s.ready();
    await page.click('#tabs button[data-view=publish]');
    await page.fill('#publish-channel', 'admin-room');
    await page.fill('#publish-data', '{"text": "from the admin console"}');
    await page.click('#publish-send');
    await page.waitForFunction(() => document.querySelector('#publish-result')?.textContent?.includes('offset'));
    await waitFor(() => got.length > 0, 'the publication on node 3');
    expect(got).toEqual([{ text: 'from the admin console' }]);
    await shot('publish');
  });

  it('lists channels cluster-wide and shows presence and history', async () => {
    await page.click('#tabs button[data-view=channels]');
    await page.fill('#channels-q', 'admin-');
    await page.click('#channels-form button');
    await page.waitForFunction(
      () => document.querySelector('#channels tbody')?.textContent?.includes('admin-room'),
      null,
      {
        timeout: 10_000,
      },
    );
    await shot('channels');
    await page.click('#channels tbody tr.link');
    await page
      .waitForFunction(() => document.querySelector('#history tbody')?.textContent?.includes('admin console'), null, {
        timeout: 10_000,
      })
      .catch(async (e) => {
        await shot('debug-channel');
        throw e;
      });
    expect(await page.$$eval('#presence tbody tr', (r) => r.length)).toBe(1);
    // The subscriber is on node 3; node 1 asked every node which one hosts it.
    expect(await page.textContent('#presence tbody')).toContain('admin-n3');
    expect(await page.textContent('#channel-body')).toContain('1 subscriber');
    await shot('channel');
  });

  it("disconnects a user's connections on another node", async () => {
    const alice = clients.filter((_, i) => i === 1 || i === 2);
    const codes: number[] = [];
    for (const c of alice) c.on('disconnected', (ctx: { code: number }) => codes.push(ctx.code));
    await page.click('#tabs button[data-view=connections]');
    await page.fill('#user-input', 'alice');
    await page.click('#user-search');
    // Node 1 asks the other nodes through the broker: both of alice's connections, on node 2.
    await page.waitForFunction(() => document.querySelectorAll('#user-clients tbody tr').length === 2);
    expect(
      await page.$$eval('#user-clients tbody tr', (rows) => rows.map((r) => (r as HTMLElement).dataset.node)),
    ).toEqual(['admin-n2', 'admin-n2']);
    expect(await page.textContent('#user-note')).toBe('2 connection(s) on 3 node(s).');
    await page.click('#disconnect-user');
    await page.waitForFunction(() => document.querySelector('#disconnect-result')?.textContent?.includes('alice'));
    await waitFor(() => alice.every((c) => c.state === 'disconnected'), "alice's connections closed");
    expect(codes).toEqual([4502, 4502]);
    // Bob, another user, stays connected.
    expect(clients[4].state).toBe('connected');
    await shot('connections');
    await page.click('#tabs button[data-view=overview]');
    await waitFor(async () => (await connectionsByNode())['admin-n2'] === '0', 'node 2 at 0 connections', 15_000, 200);
    expect(pageErrors).toEqual([]);
  });

  it('lists the admin actions of this session in the audit log', async () => {
    await page.click('#tabs button[data-view=audit]');
    await page.waitForSelector('#audit tbody tr[data-action="disconnect"]', { timeout: 10_000 });
    const rows = await page.$$eval('#audit tbody tr', (trs) =>
      trs.map((r) => [(r as HTMLElement).dataset.action, r.children[1]?.textContent, r.children[4]?.textContent]),
    );
    // Newest first; the wrong password of the first test is not an entry, the login is.
    expect(rows).toEqual([
      ['disconnect', 'session-1', 'user=alice'],
      ['publish', 'session-1', 'admin-room'],
      ['login', 'session-1', ''],
    ]);
    expect(await page.textContent('#audit tbody')).not.toContain(PASSWORD);
    await shot('audit');
    expect(pageErrors).toEqual([]);
  });
});

describe('admin UI of a --dev node without a password', () => {
  it('logs itself in', async () => {
    const dev = await HeraldServer.start(inject('heraldBin'), { env: { HERALD_NODE_NAME: 'admin-dev' } });
    try {
      await page.goto(`${dev.http}/admin/`);
      await page.waitForSelector('#view-overview', { state: 'visible' });
      expect(await page.isVisible('#login')).toBe(false);
      await page.waitForSelector('#nodes tbody tr[data-node="admin-dev"]');
    } finally {
      await dev.stop();
    }
  });
});
