// Build: type declarations with tsc, bundles with esbuild. `node scripts/build.mjs`.
import { build } from 'esbuild';
import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { createRequire } from 'node:module';
import { demoBundle, packageBundles, root } from './build-config.mjs';

rmSync(resolve(root, 'dist'), { recursive: true, force: true });

const require = createRequire(import.meta.url);
const tsc = require.resolve('typescript/bin/tsc');
execFileSync(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: root, stdio: 'inherit' });

await Promise.all([demoBundle, ...packageBundles].map((opts) => build(opts)));
console.log('built dist/ and demo/herald.js');
