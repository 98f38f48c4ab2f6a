// A `ws` WebSocket that records what the client sends on each real socket, so tests can check the
// exact commands (e.g. one `connect` carrying every subscription) without mocking the network.
import WS from 'ws';
import type { WebSocketConstructor } from '../../src/transport.js';

export function recordingWebSocket(): { WebSocket: WebSocketConstructor; sockets: string[][] } {
  const sockets: string[][] = [];
  class RecordingWebSocket extends WS {
    private readonly sentLog: string[] = [];
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols);
      sockets.push(this.sentLog);
    }
    override send(data: any, ...rest: any[]): void {
      this.sentLog.push(String(data));
      (WS.prototype.send as (...a: any[]) => void).call(this, data, ...rest);
    }
  }
  return { WebSocket: RecordingWebSocket as unknown as WebSocketConstructor, sockets };
}

/** Parsed commands of one socket's log. */
export function commandsOf(log: string[]): Array<Record<string, any>> {
  return log.filter((s) => s !== '{}').map((s) => JSON.parse(s));
}
