// The built package (dist/) works from both module systems in Node, against the real server.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Herald } from '../../src/index.js';
import { HeraldServer, waitFor } from '../support/server.js';

const root = resolve(__dirname, '..', '..');
let server: HeraldServer;

beforeAll(async () => {
  if (!existsSync(resolve(root, 'dist', 'index.node.cjs'))) throw new Error('run `npm run build` first');
  server = await HeraldServer.start(inject('heraldBin'));
});
afterAll(async () => {
  await server?.stop();
});

async function roundTrip(mod: { Herald: typeof Herald }, channel: string): Promise<void> {
  const client = new mod.Herald(server.ws);
  const got: unknown[] = [];
  const sub = client.subscribe(channel, { onPublication: (p) => got.push(p.data) });
  client.connect();
  await sub.ready();
  await server.publish(channel, { ok: true });
  await waitFor(() => got.length === 1, `publication via ${channel}`);
  expect(got).toEqual([{ ok: true }]);
  client.disconnect();
}

describe('package builds', () => {
  it('CommonJS: require("@herald/client")', async () => {
    const require = createRequire(resolve(root, 'package.json'));
    await roundTrip(require('@herald/client'), 'pkg-cjs');
  });

  it('ESM: import("@herald/client")', async () => {
    const mod = await import(resolve(root, 'dist', 'index.node.mjs'));
    await roundTrip(mod, 'pkg-esm');
  });

  it('the browser bundle imports nothing', async () => {
    const { readFileSync } = await import('node:fs');
    for (const f of ['dist/index.browser.mjs', 'dist/herald.min.js', 'demo/herald.js']) {
      const src = readFileSync(resolve(root, f), 'utf8');
      expect(src, f).not.toMatch(/\bfrom\s*["'][^"'.]/);
      expect(src, f).not.toMatch(/\brequire\(/);
    }
  });
});
