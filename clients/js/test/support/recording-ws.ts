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
    override send(data: Parameters<WS['send']>[0], ...rest: unknown[]): void {
      this.sentLog.push(String(data));
      (WS.prototype.send as (...a: unknown[]) => void).call(this, data, ...rest);
    }
  }
  return { WebSocket: RecordingWebSocket as unknown as WebSocketConstructor, sockets };
}

/** One command as sent: `{ id, <method>: params }`; `connect` spelled out for the tests that read it. */
export interface SentCommand {
  id: number;
  connect?: { subs?: Record<string, { since?: { epoch: string; offset: number } }> };
  [method: string]: unknown;
}

/** Parsed commands of one socket's log. */
export function commandsOf(log: string[]): SentCommand[] {
  return log.filter((s) => s !== '{}').map((s) => JSON.parse(s));
}
