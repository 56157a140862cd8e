//! What the daemon (`limiter`) and the allocator (`limiter-allocator`) both serve, in one
//! copy: the Prometheus endpoint ([`metrics`]) and the root-only control socket
//! ([`control`]).

pub mod control;
pub mod metrics;
