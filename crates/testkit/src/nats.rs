//! nats-server for tests (written by the NATS broker work).
