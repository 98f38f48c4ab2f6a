// A TCP proxy in front of the server, so tests can cut a client's connection for real: `cut()`
// destroys every proxied socket and stops listening (reconnects are refused), `restore()` listens
// again on the same port. `blackhole()` keeps sockets open but forwards nothing, which is how a
// dead network path looks to both ends. `blockWebSocket` answers WebSocket upgrades with 403, as a
// corporate proxy that only passes plain HTTP does.
import { createServer, connect, type Server, type Socket } from 'node:net';
import { freePort } from './server.js';

export class CutProxy {
  private server: Server | undefined;
  private pairs = new Set<{ client: Socket; upstream: Socket; holed: boolean }>();
  port = 0;
  /** WebSocket upgrades refused so far (with `blockWebSocket`). */
  blockedUpgrades = 0;

  constructor(
    private readonly targetPort: number,
    private readonly opts: { blockWebSocket?: boolean } = {},
  ) {}

  async start(port?: number): Promise<this> {
    this.port = port ?? this.port ?? 0;
    if (!this.port) this.port = await freePort();
    await this.listen();
    return this;
  }

  get ws(): string {
    return `ws://127.0.0.1:${this.port}/ws`;
  }
  get http(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  get connections(): number {
    return this.pairs.size;
  }

  private listen(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.targetPort, '127.0.0.1');
      const pair = { client, upstream, holed: false };
      this.pairs.add(pair);
      let first = true;
      const drop = () => {
        this.pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      client.on('data', (d) => {
        if (first && this.opts.blockWebSocket && /^upgrade:\s*websocket/im.test(d.toString('latin1'))) {
          this.blockedUpgrades++;
          client.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
          upstream.destroy();
          return;
        }
        first = false;
        if (!pair.holed) upstream.write(d);
      });
      upstream.on('data', (d) => {
        if (!pair.holed) client.write(d);
      });
      client.on('close', drop);
      upstream.on('close', drop);
      client.on('error', drop);
      upstream.on('error', drop);
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
  }

  /** Really close every connection and refuse new ones until restore(). */
  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const p of this.pairs) {
      p.client.destroy();
      p.upstream.destroy();
    }
    this.pairs.clear();
    if (server) await new Promise<void>((r) => server.close(() => r()));
  }

  async restore(): Promise<void> {
    if (!this.server) await this.listen();
  }

  /** Stop forwarding on the existing connections without closing them (new ones still work). */
  blackhole(): void {
    for (const p of this.pairs) p.holed = true;
  }

  async stop(): Promise<void> {
    await this.cut();
  }
}
