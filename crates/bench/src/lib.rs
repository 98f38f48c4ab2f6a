//! # herald-bench
//!
//! A load generator for Herald that keeps the rig out of the result (see docs/benchmarking.md): a
//! coordinator process spawns worker processes, each holding a share of the connections from its
//! own loopback source address; publishing is open-loop on a fixed schedule through the HTTP API;
//! latency is measured from the scheduled send time on one clock; histograms are merged, never
//! averaged; delivery is accounted from offsets.
//!
//! # Layout
//! - [`params`]: the command line of a run and how connections map to channels and nodes.
//! - [`coordinator`]: spawns servers and workers, drives a scenario's phases, merges results.
//! - [`worker`]: one worker's connections, accounting and histograms; its stdin/stdout protocol.
//! - [`publisher`]: open-loop HTTP publishing on a fixed schedule.
//! - [`accounting`]: offsets → delivered, duplicates, gaps, out-of-order.
//! - [`hist`]: HDR histograms: common bounds, wire encoding, merging, percentiles.
//! - [`wire`]: the part of the Herald protocol the clients speak.
//! - [`sse`]: `--transport sse`: the SSE client, its events turned into protocol lines.
//! - [`http`]: a minimal HTTP/1.1 keep-alive client.
//! - [`tls`]: `--tls-ca`: TLS for every client (`wss://`, `https://`).
//! - [`sysstat`]: `/proc` sampling (RSS, CPU) and `/metrics` scrapes.
//! - [`report`]: table, JSON and HTML/SVG output.

pub mod accounting;
pub mod coordinator;
pub mod hist;
pub mod http;
pub mod params;
pub mod publisher;
pub mod report;
pub mod sse;
pub mod sysstat;
pub mod tls;
pub mod wire;
pub mod worker;
