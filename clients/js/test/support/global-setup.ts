// Finds (or builds) the real `herald` binary once for the integration and browser projects.
// HERALD_BIN overrides; otherwise <repo>/target/debug/herald, built with cargo when missing.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    heraldBin: string;
  }
}

export const repoRoot = resolve(__dirname, '..', '..', '..', '..');

export default function setup(project: TestProject): void {
  let bin = process.env.HERALD_BIN;
  if (bin) {
    if (!existsSync(bin)) throw new Error(`HERALD_BIN=${bin} does not exist`);
  } else {
    bin = resolve(repoRoot, 'target', 'debug', 'herald');
    if (!existsSync(bin)) {
      console.log(`[herald tests] ${bin} missing: running cargo build -p herald-server …`);
      execFileSync('cargo', ['build', '-p', 'herald-server'], { cwd: repoRoot, stdio: 'inherit' });
      if (!existsSync(bin)) throw new Error(`cargo build did not produce ${bin}`);
    }
  }
  project.provide('heraldBin', bin);
}
