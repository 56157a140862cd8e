//! Fleet logic, free of I/O and of clocks: every function takes `now` (nanoseconds on
//! the caller's monotonic clock), so the daemon, the allocator and the simulator run the
//! same code, and tests run it in virtual time.

pub mod alloc;
pub mod clock;
pub mod failover;
pub mod quiet;
pub mod shard;
pub mod share;
