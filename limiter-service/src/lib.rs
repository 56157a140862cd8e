//! What the daemon (`limiter`) and the allocator (`limiter-allocator`) both serve, in one
//! copy: the Prometheus endpoint ([`metrics`]), the root-only control socket
//! ([`control`]), how they log ([`logging`]) and how they exit ([`exit`]).

pub mod control;
pub mod exit;
pub mod logging;
pub mod metrics;
