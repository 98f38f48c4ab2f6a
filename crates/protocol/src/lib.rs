//! # Herald wire protocol, v1
//!
//! The contract between the server, the SDKs and the benchmark tool (see `docs/protocol.md`).
//!
//! # Layout
//! - [`codes`]: reply error codes and WebSocket close codes.
//! - [`command`]: parsing client frames (`{"id": N, "<method>": {params}}`) into [`Command`]s.
//! - [`depth`]: the nesting limit of publication data.
//! - [`encode`]: replies and pushes, encoded once into shared bytes.
//! - [`tags`]: publication tags and the subscription tag filters that select on them.
//! - [`types`]: values shared by commands, replies and the broker (publications, positions, client info).

pub mod codes;
pub mod command;
pub mod depth;
pub mod encode;
pub mod tags;
pub mod types;

pub use codes::{CloseCode, ErrorCode};
pub use command::{Command, CommandError, Method};
pub use types::{ClientInfo, Publication, StreamPosition};

/// Subprotocol a client may request in `Sec-WebSocket-Protocol`.
pub const SUBPROTOCOL: &str = "herald.v1.json";
