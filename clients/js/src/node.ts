// Node entry point: the same API, with a WebSocket implementation registered for runtimes that do
// not have a global one (Node < 22). The browser bundles never import this file, so `ws` never
// reaches a browser.
import WebSocketNode from 'ws';
import { setDefaultWebSocket, type WebSocketConstructor } from './transport.js';

export * from './index.js';

const globalWs = (globalThis as { WebSocket?: unknown }).WebSocket as WebSocketConstructor | undefined;
setDefaultWebSocket(globalWs ?? (WebSocketNode as unknown as WebSocketConstructor));

/** Options of {@link nodeWebSocket}. */
export interface NodeWebSocketOptions {
  /**
   * Offer WebSocket compression (permessage-deflate). The server uses it only where its
   * `limits.compression` is on; otherwise the connection is the same as without. Default true.
   */
  compression?: boolean;
}

/**
 * The `ws` package as the SDK's WebSocket, with compression asked for or not:
 * `new Herald(url, { WebSocket: nodeWebSocket({ compression: true }) })`. Node 22+'s global
 * WebSocket (which the SDK uses by default there) may not offer compression; this one does.
 * Browsers negotiate compression by themselves and need nothing.
 */
export function nodeWebSocket(opts: NodeWebSocketOptions = {}): WebSocketConstructor {
  const perMessageDeflate = opts.compression ?? true;
  class HeraldNodeWebSocket extends WebSocketNode {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols, { perMessageDeflate });
    }
  }
  return HeraldNodeWebSocket as unknown as WebSocketConstructor;
}
