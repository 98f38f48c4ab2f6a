//! The integration tests' harness is herald-testkit's (`node`, `client`, `fuzz`): one `Node` and
//! one `Client` for the single-node tests here and the multi-node suites of the broker crates.
#![allow(unused_imports)]

pub(crate) use herald_testkit::client::*;
pub(crate) use herald_testkit::fuzz::*;
pub(crate) use herald_testkit::node::*;
