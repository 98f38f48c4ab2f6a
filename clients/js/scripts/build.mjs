// Build: type declarations with tsc, bundles with esbuild. `node scripts/build.mjs`.
import { build } from 'esbuild';
import { execFileSync } from 'node:child_process';
import { cpSync, rmSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { createRequire } from 'node:module';
import { demoBundle, packageBundles, root } from './build-config.mjs';

rmSync(resolve(root, 'dist'), { recursive: true, force: true });

const require = createRequire(import.meta.url);
const tsc = require.resolve('typescript/bin/tsc');
execFileSync(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: root, stdio: 'inherit' });
// The same declarations, marked CommonJS, so `require` consumers under node16 resolution type-check.
cpSync(resolve(root, 'dist/types'), resolve(root, 'dist/types-cjs'), { recursive: true });
writeFileSync(resolve(root, 'dist/types-cjs/package.json'), '{ "type": "commonjs" }\n');

await Promise.all([demoBundle, ...packageBundles].map((opts) => build(opts)));
console.log('built dist/ and demo/herald.js');
