// Node entry point: the same API, with a WebSocket implementation registered for runtimes that do
// not have a global one (Node < 22). The browser bundles never import this file, so `ws` never
// reaches a browser.
import WebSocketNode from 'ws';
import { setDefaultWebSocket, type WebSocketConstructor } from './transport.js';

export * from './index.js';

const globalWs = (globalThis as { WebSocket?: unknown }).WebSocket as WebSocketConstructor | undefined;
setDefaultWebSocket(globalWs ?? (WebSocketNode as unknown as WebSocketConstructor));
