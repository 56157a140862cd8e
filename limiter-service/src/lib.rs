//! What the daemon (`limiter`) and the allocator (`limiter-allocator`) both serve, in one
//! copy: the Prometheus endpoint ([`metrics`]), the root-only control socket
//! ([`control`]) and how they log ([`logging`]).

pub mod control;
pub mod logging;
pub mod metrics;
