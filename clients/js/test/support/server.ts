// Start and stop a real `herald serve --dev` on a free loopback port, and talk to its HTTP API.
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';

export const API_KEY = 'testkey';

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Poll until `fn` returns truthy or time runs out. */
export async function waitFor<T>(fn: () => T | Promise<T>, what: string, timeoutMs = 15_000, stepMs = 25): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(stepMs);
  }
}

export interface StartOptions {
  port?: number;
  env?: Record<string, string>;
  args?: string[];
}

export class HeraldServer {
  private output: string[] = [];
  private exited: Promise<number | null>;

  private constructor(
    readonly bin: string,
    readonly port: number,
    private child: ChildProcess,
  ) {
    const keep = (d: Buffer) => {
      this.output.push(d.toString());
      if (this.output.length > 2000) this.output.splice(0, 1000);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    this.exited = new Promise((r) => child.once('exit', (code) => r(code)));
  }

  static async start(bin: string, opts: StartOptions = {}): Promise<HeraldServer> {
    const port = opts.port ?? (await freePort());
    const child = spawn(bin, ['serve', '--dev', '--port', String(port), ...(opts.args ?? [])], {
      env: { ...process.env, HERALD_API_KEY: API_KEY, RUST_LOG: process.env.RUST_LOG ?? 'info', ...opts.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const server = new HeraldServer(bin, port, child);
    let dead = false;
    void server.exited.then(() => (dead = true));
    await waitFor(
      async () => {
        if (dead) throw new Error(`herald exited during startup:\n${server.logs()}`);
        try {
          const r = await fetch(`${server.http}/health`);
          return r.status === 200;
        } catch {
          return false;
        }
      },
      `herald /health on port ${port}`,
      20_000,
      50,
    );
    return server;
  }

  get http(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  get ws(): string {
    return `ws://127.0.0.1:${this.port}/ws`;
  }
  logs(): string {
    return this.output.join('');
  }

  /** Call the server HTTP API; throws on a non-2xx status. */
  async api<T = unknown>(path: string, body?: unknown): Promise<T> {
    const r = await fetch(`${this.http}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    if (!r.ok) throw new Error(`${path} → HTTP ${r.status}: ${text}`);
    return text ? JSON.parse(text) : ({} as T);
  }

  publish(channel: string, data: unknown): Promise<{ epoch: string; offset: number }> {
    return this.api('/api/publish', { channel, data });
  }

  /** Stop the server (SIGTERM: graceful drain) and wait for it to exit. */
  async stop(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 15_000): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill(signal);
    const timer = setTimeout(() => this.child.kill('SIGKILL'), timeoutMs);
    await this.exited;
    clearTimeout(timer);
  }
}
