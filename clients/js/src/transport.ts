// One WebSocket, wrapped. The client opens a new Transport per connection attempt and drops the old
// one entirely: every callback of a dropped transport is cut off, so a late `close` or `message`
// from a previous socket can never disturb the current connection's state.

import { EmulatedWebSocket } from './emulation.js';

/** The part of the WHATWG WebSocket API the SDK uses; browsers, `ws` and Node 22+ all provide it. */
export interface WebSocketLike {
  readonly readyState: number;
  binaryType?: string;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code?: number; reason?: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

const OPEN = 1;

let defaultWebSocket: WebSocketConstructor | undefined;

/** The Node entry point registers `ws` here when the runtime has no global WebSocket. */
export function setDefaultWebSocket(impl: WebSocketConstructor | undefined): void {
  defaultWebSocket = impl;
}

export function resolveWebSocket(explicit?: WebSocketConstructor): WebSocketConstructor {
  const impl =
    explicit ??
    defaultWebSocket ??
    ((globalThis as { WebSocket?: unknown }).WebSocket as WebSocketConstructor | undefined);
  if (!impl) {
    throw new Error(
      'Herald: no WebSocket implementation found. In Node < 22 install `ws` (it is a dependency of ' +
        'the package) or pass `WebSocket` in the options.',
    );
  }
  return impl;
}

export interface TransportHandlers {
  onOpen(): void;
  onText(text: string): void;
  onClose(code: number, reason: string): void;
  onError(err: unknown): void;
}

const noop = (): void => {};

let decoder: TextDecoder | undefined;
function toText(data: unknown): string | undefined {
  if (typeof data === 'string') return data;
  // Herald sends text frames only, but tolerate binary (ArrayBuffer, Node Buffer, typed arrays).
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) {
    decoder ??= new TextDecoder();
    return decoder.decode(data as ArrayBuffer);
  }
  return undefined;
}

export class Transport {
  private ws: WebSocketLike;
  private handlers: TransportHandlers | undefined;
  /** Whether this is WebSocket emulation over HTTP rather than a WebSocket. */
  readonly emulated: boolean;

  constructor(
    url: string,
    impl: WebSocketConstructor,
    protocols: string | string[] | undefined,
    handlers: TransportHandlers,
  ) {
    this.handlers = handlers;
    this.emulated = impl === EmulatedWebSocket;
    // The constructor may throw synchronously (bad URL); the caller treats that as a failed attempt.
    this.ws = protocols === undefined ? new impl(url) : new impl(url, protocols);
    try {
      this.ws.binaryType = 'arraybuffer';
    } catch {
      // Some implementations have a read-only binaryType; text frames do not need it.
    }
    this.ws.onopen = () => this.handlers?.onOpen();
    this.ws.onmessage = (ev) => {
      const text = toText(ev.data);
      if (text !== undefined) this.handlers?.onText(text);
    };
    this.ws.onerror = (ev) => this.handlers?.onError(ev);
    this.ws.onclose = (ev) => {
      const h = this.handlers;
      this.detach();
      h?.onClose(typeof ev?.code === 'number' ? ev.code : 1006, typeof ev?.reason === 'string' ? ev.reason : '');
    };
  }

  get open(): boolean {
    return this.ws.readyState === OPEN;
  }

  /** Send one text frame; false when the socket is not open (the frame is dropped). */
  send(text: string): boolean {
    if (!this.open) return false;
    try {
      this.ws.send(text);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Close and forget. No callback fires afterwards: the client has already decided what happens
   * next, and a dead peer may never complete the closing handshake.
   */
  close(abort = false): void {
    this.detach();
    const ws = this.ws as WebSocketLike & { terminate?: () => void };
    try {
      // `ws` (Node) can drop the TCP connection at once; waiting for a closing handshake from a peer
      // we already consider dead would hold the socket for up to 30 s. Browsers only allow 1000
      // (or 3000–4999) from client code, and 1000 says what we mean: we are done with it.
      if (abort && typeof ws.terminate === 'function') ws.terminate();
      else ws.close(1000);
    } catch {
      // Closing a socket that is still connecting throws in some implementations; it is gone anyway.
    }
  }

  private detach(): void {
    this.handlers = undefined;
    // Keep no-op listeners rather than null: `ws` throws on an 'error' event with no listener.
    this.ws.onopen = noop;
    this.ws.onmessage = noop;
    this.ws.onerror = noop;
    this.ws.onclose = noop;
  }
}
