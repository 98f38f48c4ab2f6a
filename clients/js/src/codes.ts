// Numeric codes of the Herald protocol (docs/protocol.md), plus the few codes the SDK itself uses for
// events it detects locally. Kept in one place so the client, the errors and the docs agree.

/** Reply error codes (`error.code` in a command reply). */
export const ErrorCode = {
  Internal: 100,
  Unauthorized: 101,
  UnknownNamespace: 102,
  PermissionDenied: 103,
  UnknownMethod: 104,
  AlreadySubscribed: 105,
  LimitExceeded: 106,
  BadRequest: 107,
  NotAvailable: 108,
  TokenExpired: 109,
  TooManyRequests: 110,
  TemporarilyUnavailable: 111,
  /** The application's backend (a proxy hook) was unreachable or too slow: retry later. */
  BackendUnavailable: 112,
} as const;

/** WebSocket close codes the server uses (and the `disconnect` push repeats). */
export const CloseCode = {
  Shutdown: 4000,
  SlowConsumer: 4001,
  NoPong: 4002,
  InsufficientState: 4003,
  TokenExpired: 4004,
  /** The application's backend (connect or refresh proxy) failed: reconnect later. */
  BackendError: 4005,
  BadRequest: 4500,
  Unauthorized: 4501,
  DisconnectedByApi: 4502,
  MessageTooLarge: 4503,
  ConnectionLimit: 4504,
  /** The application's backend refused the connection (connect proxy `error`). */
  RefusedByBackend: 4505,
} as const;

/** `unsub` push codes. */
export const UnsubCode = {
  /** The server ended the subscription for good (API `unsubscribe`). */
  Server: 2000,
  /** The node lost the channel's continuity: subscribe again with `since`. */
  Resubscribe: 4003,
  /** The subscription token expired: subscribe again with a new token. */
  TokenExpired: 4004,
} as const;

/**
 * Codes for things the SDK notices on its own. They are below 1000 so they can never be confused
 * with a WebSocket close code or a protocol code.
 */
export const ClientCode = {
  /** `connect()` was called. */
  ConnectCalled: 0,
  /** `disconnect()` was called. */
  DisconnectCalled: 1,
  /** The socket closed without a Herald close code (network drop, server gone, 1006 …). */
  TransportClosed: 2,
  /** Nothing arrived for `ping_interval` + grace: the connection is presumed dead. */
  NoPing: 3,
  /** The `connect` command got no reply in time. */
  ConnectTimeout: 4,
  /** `getToken` returned no token: the app says this user may not connect. */
  NoToken: 5,
  /** The server replied to `connect` with an error the SDK does not retry. */
  ConnectRejected: 6,
  /** A command got no reply within `timeoutMs`. */
  Timeout: 7,
  /** The connection went away while a command was in flight; its outcome is unknown. */
  ConnectionLost: 8,
  /** A call that needs a connection was made while the client is disconnected. */
  NotConnected: 9,
  /** The server sent something the SDK could not parse. */
  BadFrame: 10,
  /** `subscribe()` was called for a channel that already has a subscription on this client. */
  AlreadySubscribed: 11,
  /** The subscription was ended by `unsubscribe()`. */
  UnsubscribeCalled: 12,
} as const;

export type ErrorCodeValue = (typeof ErrorCode)[keyof typeof ErrorCode];
export type CloseCodeValue = (typeof CloseCode)[keyof typeof CloseCode];
export type ClientCodeValue = (typeof ClientCode)[keyof typeof ClientCode];

/** Reply errors worth retrying on their own: the request was fine, the moment was not. */
export function isTemporaryError(code: number): boolean {
  return (
    code === ErrorCode.Internal ||
    code === ErrorCode.TooManyRequests ||
    code === ErrorCode.TemporarilyUnavailable ||
    code === ErrorCode.BackendUnavailable
  );
}

/**
 * The close-code rule of docs/protocol.md: 4000–4499 reconnect, 4500–4999 stay down. Anything else
 * (1000, 1001, 1006, 1011 …) is a transport event, not a verdict by Herald, so the client
 * reconnects: a network blip must never leave an app silently offline.
 */
export function shouldReconnect(closeCode: number): boolean {
  if (closeCode >= 4500 && closeCode <= 4999) return false;
  return true;
}

/**
 * `unsub` pushes carry a code too. The protocol says the server asks for a resubscribe "with a
 * resubscribe code"; the SDK reads the same ranges as for close codes: 4000–4499 means "recover by
 * subscribing again", anything else ends the subscription for good.
 */
export function shouldResubscribe(unsubCode: number): boolean {
  return unsubCode >= 4000 && unsubCode <= 4499;
}
