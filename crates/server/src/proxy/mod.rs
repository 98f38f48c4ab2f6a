//! Proxy hooks on the server side: the HTTP client that calls the application's backend
//! ([`client`]), `binary_encoding`'s `b64data` on the wire ([`binary`]) and what of the client's
//! HTTP request is forwarded to it ([`meta`]). The hooks'
//! logic (what is asked, what the answers mean) is in `herald_core::proxy`; docs/proxy.md
//! describes both.

pub mod binary;
pub mod client;
pub mod meta;

pub use client::HttpProxy;
pub use meta::client_meta;
