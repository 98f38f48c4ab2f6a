// WebSocket emulation over plain HTTP, for networks that will not carry a WebSocket (some corporate
// proxies, some mobile carriers). The server's frames stream down as Server-Sent Events from
// `GET /connection/emulation`; the client's messages go up as `POST /connection/emulation?session=…`.
// `EmulatedSocket` looks like a WebSocket to `Transport`, so the client's protocol, recovery and
// exactly-once delivery are the same code on both.
//
// The downstream is read with `fetch` and a stream reader rather than `EventSource`: it works in
// Node as in browsers, and `EventSource` would reconnect on its own behind the client's back.

import type { WebSocketConstructor, WebSocketLike } from './transport.js';

const CONNECTING = 0;
const OPEN = 1;
const CLOSED = 3;

/** The emulation endpoint for a WebSocket URL: same host, `http(s)`, `/connection/emulation`. */
export function emulationUrl(wsUrl: string): string {
  const u = new URL(wsUrl);
  u.protocol = u.protocol === 'wss:' ? 'https:' : u.protocol === 'ws:' ? 'http:' : u.protocol;
  u.pathname = '/connection/emulation';
  u.search = '';
  u.hash = '';
  return u.toString();
}

interface SseEvent {
  name: string;
  data: string;
}

/** Split SSE text into complete events; returns them and the unfinished rest. */
function parseEvents(buffer: string): { events: SseEvent[]; rest: string } {
  const events: SseEvent[] = [];
  let start = 0;
  for (;;) {
    const end = buffer.indexOf('\n\n', start);
    if (end < 0) break;
    let name = '';
    const data: string[] = [];
    for (const line of buffer.slice(start, end).split('\n')) {
      if (line.startsWith('event: ')) name = line.slice(7);
      else if (line.startsWith('data: ')) data.push(line.slice(6));
    }
    if (data.length > 0) events.push({ name, data: data.join('\n') });
    start = end + 2;
  }
  return { events, rest: buffer.slice(start) };
}

/** A WebSocket look-alike over SSE (down) and POST (up). */
export class EmulatedSocket implements WebSocketLike {
  readyState = CONNECTING;
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code?: number; reason?: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;

  private readonly url: string;
  private readonly abort = new AbortController();
  private session = '';
  private closeCode = 1006;
  private closeReason = '';
  /** Messages waiting for the POST in flight: sent together, in order, by the next one. */
  private queue: string[] = [];
  private posting = false;

  constructor(wsUrl: string) {
    this.url = emulationUrl(wsUrl);
    void this.read();
  }

  send(data: string): void {
    if (this.readyState !== OPEN) throw new Error('emulated socket is not open');
    this.queue.push(data);
    if (!this.posting) void this.flush();
  }

  close(code?: number, reason?: string): void {
    if (this.readyState === CLOSED) return;
    this.closeCode = code ?? 1000;
    this.closeReason = reason ?? '';
    this.abort.abort();
  }

  /** POST queued messages one request at a time, so the server gets them in the order sent. */
  private async flush(): Promise<void> {
    this.posting = true;
    try {
      while (this.queue.length > 0 && this.readyState === OPEN) {
        // The server reads newline-separated messages from one body, as from one WebSocket message.
        const body = this.queue.join('\n');
        this.queue = [];
        const res = await fetch(`${this.url}?session=${encodeURIComponent(this.session)}`, {
          method: 'POST',
          // text/plain keeps the request "simple": no CORS preflight per message.
          headers: { 'Content-Type': 'text/plain' },
          body,
          signal: this.abort.signal,
        });
        if (res.status !== 204) {
          // The session is gone or refused the message: the downstream carries why, or ends.
          this.fail(1006, `POST answered ${res.status}`);
          return;
        }
      }
    } catch (e) {
      this.fail(1006, e instanceof Error ? e.message : String(e));
    } finally {
      this.posting = false;
    }
  }

  private async read(): Promise<void> {
    try {
      const res = await fetch(this.url, {
        headers: { Accept: 'text/event-stream' },
        signal: this.abort.signal,
        cache: 'no-store',
      });
      if (!res.ok || !res.body) throw new Error(`emulation endpoint answered ${res.status}`);
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const parsed = parseEvents(buffer + decoder.decode(value, { stream: true }));
        buffer = parsed.rest;
        for (const ev of parsed.events) this.dispatch(ev);
        if (this.readyState === CLOSED) return;
      }
    } catch (e) {
      if (this.readyState !== CLOSED) this.onerror?.(e);
    }
    this.finish();
  }

  private dispatch(ev: SseEvent): void {
    if (ev.name === 'session') {
      this.session = (JSON.parse(ev.data) as { session: string }).session;
      this.readyState = OPEN;
      this.onopen?.({});
    } else if (ev.name === 'close') {
      const c = JSON.parse(ev.data) as { code?: number; reason?: string };
      this.closeCode = c.code ?? 1006;
      this.closeReason = c.reason ?? '';
    } else if (ev.name === '') {
      this.onmessage?.({ data: ev.data });
    }
  }

  private fail(code: number, reason: string): void {
    if (this.readyState === CLOSED) return;
    this.closeCode = code;
    this.closeReason = reason;
    this.abort.abort();
  }

  private finish(): void {
    if (this.readyState === CLOSED) return;
    this.readyState = CLOSED;
    this.abort.abort();
    this.onclose?.({ code: this.closeCode, reason: this.closeReason });
  }
}

/** `EmulatedSocket` as a WebSocket constructor, for `Transport`. */
export const EmulatedWebSocket: WebSocketConstructor = EmulatedSocket;
