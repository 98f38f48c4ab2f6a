/**
 * A pusher-js plugin for Herald's catch-up extension (docs/pusher.md): subscriptions ask for
 * positions, and after a reconnect for what was published since the last event handled, so a
 * pusher-js client that drops gets what it missed, once and in order, within the history window.
 *
 * It needs no import of pusher-js: it takes any client shaped like one (`send_event` and
 * `connection`). pusher-js drops unknown top-level fields when it decodes a message, so positions
 * are read from the raw transport's `message` events.
 */

/** A channel's position: the epoch from `subscription_succeeded`, the last `herald_offset`. */
type Position = { epoch: string; offset: number };

type RawMessage = { event?: string; channel?: string; data?: unknown; herald_offset?: number };

type RawTransport = { bind: (event: string, f: (m: { data: string }) => void) => void };

/** The part of a pusher-js `Pusher` client the plugin uses. */
export interface PusherLike {
  send_event(name: string, data: Record<string, unknown>, channel?: string): boolean;
  connection: { bind(event: string, f: () => void): unknown };
}

/** Make `pusher` catch up after reconnects; returns the same client. */
export function withPusherCatchUp<P extends PusherLike>(pusher: P): P {
  const positions = new Map<string, Position>();
  const send = pusher.send_event.bind(pusher);
  pusher.send_event = (name: string, data: Record<string, unknown>, channel?: string) => {
    if (name === 'pusher:subscribe') {
      const since = positions.get(data.channel as string);
      data = since ? { ...data, herald_since: since } : { ...data, herald_positions: true };
    }
    return send(name, data, channel);
  };
  pusher.connection.bind('connected', () => {
    const transport = (pusher.connection as unknown as { connection: { transport: RawTransport } }).connection
      .transport;
    transport.bind('message', (m) => {
      const msg = JSON.parse(m.data) as RawMessage;
      if (!msg.channel) return;
      if (msg.event === 'pusher_internal:subscription_succeeded' && typeof msg.data === 'string') {
        const herald = (JSON.parse(msg.data) as { herald?: Position & { recovered?: boolean } }).herald;
        const known = positions.get(msg.channel);
        // Keep the position when everything since it was recovered; otherwise start over there.
        if (herald && !(known && herald.recovered)) {
          positions.set(msg.channel, { epoch: herald.epoch, offset: herald.offset });
        }
      } else if (typeof msg.herald_offset === 'number') {
        const known = positions.get(msg.channel);
        if (known) known.offset = msg.herald_offset;
      }
    });
  });
  return pusher;
}
