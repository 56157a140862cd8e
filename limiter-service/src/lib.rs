//! What the daemon (`limiter`) and the allocator (`limiter-allocator`) both serve, in one
//! copy: the Prometheus endpoint ([`metrics`]), the root-only control socket
//! ([`control`]), how they log ([`logging`]), how they exit ([`exit`]), how they tell
//! systemd they are ready ([`notify`]), and the shell completions and man pages
//! generated from their command lines ([`cli_docs`]), and the arguments their command
//! lines share ([`cli_args`]).

pub mod cli_args;
pub mod cli_docs;
pub mod control;
pub mod exit;
pub mod logging;
pub mod metrics;
pub mod notify;
