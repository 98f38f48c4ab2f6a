//! redis-server for tests (written by the Redis broker work).
