// An in-memory WebSocket for unit tests of the state machine. The test plays the server: it opens
// the socket, reads the commands the client sent and pushes frames back.
import type { WebSocketLike } from '../../src/transport.js';

/** One command as the client sent it: `{ id, <method>: params }`. */
export interface SentCommand {
  id: number;
  [method: string]: unknown;
}

export class FakeSocket implements WebSocketLike {
  static instances: FakeSocket[] = [];
  static reset(): void {
    FakeSocket.instances = [];
  }
  static last(): FakeSocket {
    const s = FakeSocket.instances[FakeSocket.instances.length - 1];
    if (!s) throw new Error('no socket was opened');
    return s;
  }

  readyState = 0;
  binaryType = 'blob';
  sent: string[] = [];
  closedByClient: { code?: number } | undefined;
  terminated = false;
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code?: number; reason?: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;

  constructor(
    readonly url: string,
    readonly protocols?: string | string[],
  ) {
    FakeSocket.instances.push(this);
  }

  send(data: string): void {
    if (this.readyState !== 1) throw new Error('send on a socket that is not open');
    this.sent.push(data);
  }
  close(code?: number): void {
    this.closedByClient = { code };
    this.readyState = 3;
  }
  terminate(): void {
    this.terminated = true;
    this.readyState = 3;
  }

  // ---- server side ----
  open(): void {
    this.readyState = 1;
    this.onopen?.({});
  }
  /** Push one frame: an object, or raw text (for batched frames). */
  push(msg: object | string): void {
    this.onmessage?.({ data: typeof msg === 'string' ? msg : JSON.stringify(msg) });
  }
  serverClose(code: number, reason = ''): void {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  commands(): SentCommand[] {
    return this.sent.map((s) => JSON.parse(s));
  }
  /** The last command of a method: its id and params. */
  cmd(method: string): { id: number; params: Record<string, unknown> } {
    const all = this.commands().filter((c) => method in c);
    const c = all[all.length - 1];
    if (!c) throw new Error(`no ${method} command sent; sent: ${this.sent.join(' | ')}`);
    return { id: c.id, params: c[method] as Record<string, unknown> };
  }
  countOf(method: string): number {
    return this.commands().filter((c) => method in c).length;
  }
  reply(method: string, result: object): void {
    this.push({ id: this.cmd(method).id, [method]: result });
  }
  replyError(method: string, code: number, message = 'nope'): void {
    this.push({ id: this.cmd(method).id, error: { code, message } });
  }
  /** Open and accept the `connect`. */
  accept(result: Record<string, unknown> = {}): void {
    if (this.readyState !== 1) this.open();
    this.reply('connect', { client: 'c1', node: 'n1', ping_interval: 25, ...result });
  }
}
