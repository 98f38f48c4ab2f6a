//! The Pusher protocol's close and error codes that Herald sends, named (Pusher's own numbering:
//! 4000–4099 do not reconnect, 4100–4199 reconnect after a backoff, 4200–4299 reconnect at once,
//! 4300–4399 other errors), and the one WebSocket code Herald's codec sends itself.

/// The app key names no configured app.
pub const APP_NOT_FOUND: u16 = 4001;
/// The app key names an app that is disabled (a database row with `enabled` false).
pub const APP_DISABLED: u16 = 4003;
/// The client asked for a protocol version this server does not speak.
pub const UNSUPPORTED_PROTOCOL: u16 = 4007;
/// The client sent no `protocol` query parameter.
pub const NO_PROTOCOL_VERSION: u16 = 4008;
/// Unauthorized: a failed `pusher:signin`, or connections terminated through the HTTP API.
pub const UNAUTHORIZED: u16 = 4009;
/// Over capacity (an app's or the node's connection limit, or a client that fell behind): retry
/// after a backoff.
pub const OVER_CAPACITY: u16 = 4100;
/// A new connection reached a node that is draining: reconnect after a back-off (pusher-js
/// waits a second), not at once, which would bring the client straight back to this node in a
/// loop while the load balancer still sends it here.
pub const DRAINING_TRY_LATER: u16 = 4100;
/// The server is going away (drain): reconnect now, to another node.
pub const RECONNECT_NOW: u16 = 4200;
/// A message over the WebSocket codec's limit (the WebSocket code "message too big", which the
/// codec's own close frame carries; pusher-js reconnects after a second).
pub const MESSAGE_TOO_BIG: u16 = 1009;
/// No pong came back in time.
pub const PONG_NOT_RECEIVED: u16 = 4201;
/// A client event over the app's rate.
pub const CLIENT_EVENT_RATE_LIMITED: u16 = 4301;
