// examples/cookie-sessions in a real browser: the example app (Python, standard library) and the
// real server with the example's herald.toml, Debian's Chromium headless. The user signs in with a
// form; the HttpOnly session cookie rides on the WebSocket upgrade and the connect proxy turns it
// into the user; the subscribe proxy lets them into room:lobby but not room:staff; the publish
// proxy rewrites what they say; rpc() is answered by the app.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../support/global-setup.js';
import { HeraldServer, freePort, waitFor } from '../support/server.js';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const exampleDir = resolve(repoRoot, 'examples', 'cookie-sessions');

let app: ChildProcess;
let appPort: number;
let server: HeraldServer;
let context: BrowserContext;
let profile: string;
let configDir: string | undefined;

beforeAll(async () => {
  const heraldPort = await freePort();
  app = spawn('python3', [join(exampleDir, 'app.py'), '--port', '0', '--hook-port', '0'], {
    env: { ...process.env, HERALD_WS: `ws://127.0.0.1:${heraldPort}/ws` },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const line = await new Promise<string>((ok, fail) => {
    createInterface({ input: app.stdout as NodeJS.ReadableStream }).once('line', ok);
    app.once('exit', () => fail(new Error('example app exited')));
  });
  const [, publicPort, hookPort] = line.split(' ');
  appPort = Number(publicPort);
  // The example's own config, pointed at this run's hook port and app origin (as run.sh does).
  configDir = mkdtempSync(join(tmpdir(), 'herald-example-'));
  const config = join(configDir, 'herald.toml');
  const toml = readFileSync(join(exampleDir, 'herald.toml'), 'utf8')
    .replaceAll('127.0.0.1:8081', `127.0.0.1:${hookPort}`)
    .replaceAll('127.0.0.1:8080', `127.0.0.1:${appPort}`)
    .replaceAll('localhost:8080', `localhost:${appPort}`);
  writeFileSync(config, toml);
  server = await HeraldServer.start(inject('heraldBin'), { port: heraldPort, args: ['--config', config] });
  profile = mkdtempSync(join(tmpdir(), 'herald-chromium-'));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
  });
});

afterAll(async () => {
  await context?.close().catch(() => {});
  await server?.stop();
  app?.kill();
  if (profile) rmSync(profile, { recursive: true, force: true });
  if (configDir) rmSync(configDir, { recursive: true, force: true });
});

async function signIn(page: Page, name: string): Promise<void> {
  await page.goto(`http://127.0.0.1:${appPort}/`);
  await page.fill('#name', name);
  await page.click('#signin');
  await page.waitForSelector('#messages');
  await waitFor(async () => (await page.textContent('#state')) === 'connected', `${name} connected`);
}

describe('examples/cookie-sessions in Chromium', () => {
  it('signs in by cookie, chats through the publish proxy, calls rpc, is kept out of room:staff', async () => {
    const alice = context.pages()[0] ?? (await context.newPage());
    await signIn(alice, 'alice');
    expect(await alice.textContent('#me')).toBe('Alice');
    await waitFor(async () => (await alice.textContent('#topic')) === 'Lobby', 'room:lobby subscribed');

    // A second user in another context (its own cookie jar) sees what alice says, rewritten.
    const other = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
    try {
      const bob = await (await other.newContext()).newPage();
      await signIn(bob, 'bob');
      await waitFor(async () => (await bob.textContent('#topic')) === 'Lobby', 'bob in room:lobby');

      await alice.fill('#text', '  what the darn heck  ');
      await alice.click('#send button');
      const said = async (page: Page) => page.$$eval('#messages li', (lis) => lis.map((li) => li.textContent));
      await waitFor(async () => (await said(bob)).length === 1, 'bob got the message');
      expect(await said(bob)).toEqual(['Alice: what the **** ****']);
      expect(await said(alice)).toEqual(['Alice: what the **** ****']);

      await bob.click('#whoami');
      await waitFor(async () => (await bob.textContent('#rpc')) !== '', 'rpc answer');
      expect(JSON.parse((await bob.textContent('#rpc')) ?? '')).toEqual({ user: 'bob', staff: false });

      await bob.click('#staff');
      await waitFor(async () => (await bob.textContent('#error')) !== '', 'room:staff refused');
      expect(await bob.textContent('#error')).toBe('room:staff: staff only (1403)');
    } finally {
      await other.close();
    }

    // Without a session the connect proxy refuses: the page is the sign-in form, and a socket
    // opened anyway is refused with the app's code.
    const anonymous = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
    try {
      const page = await (await anonymous.newContext()).newPage();
      await page.goto(`http://127.0.0.1:${appPort}/`);
      expect(await page.$('#signin')).not.toBeNull();
      // A string, so that vitest's transform leaves the page's own dynamic import alone.
      const refusal = await page.evaluate(`(async () => {
        const { Herald } = await import('/herald.js');
        const client = new Herald(${JSON.stringify(server.ws)});
        return new Promise((resolve) => {
          client.on('disconnected', (c) => resolve(c));
          client.connect();
        });
      })()`);
      expect(refusal).toEqual({ code: 1401, reason: 'sign in first' });
    } finally {
      await anonymous.close();
    }
  });
});
