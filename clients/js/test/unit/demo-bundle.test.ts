// demo/herald.js is committed (the server embeds it at compile time). It must be exactly what the
// build makes from src/, or the demo would run stale code.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { build } from 'esbuild';
import { describe, expect, it } from 'vitest';
// @ts-expect-error plain .mjs without types
import { demoBundle, root } from '../../scripts/build-config.mjs';

describe('committed demo bundle', () => {
  it('matches a fresh build of src/ (run `npm run build` and commit demo/herald.js if this fails)', async () => {
    const out = await build({ ...demoBundle, write: false });
    const file = out.outputFiles?.[0];
    if (!file) throw new Error('esbuild returned no output file');
    const fresh = file.text;
    const committed = readFileSync(resolve(root, 'demo', 'herald.js'), 'utf8');
    expect(committed === fresh, 'demo/herald.js is stale').toBe(true);
  });

  it('the demo page loads the bundle as an ES module and connects to /ws', () => {
    const html = readFileSync(resolve(root, 'demo', 'index.html'), 'utf8');
    expect(html).toMatch(/<script type="module">/);
    expect(html).toContain("from './herald.js'");
    expect(html).toContain('/ws');
  });
});
