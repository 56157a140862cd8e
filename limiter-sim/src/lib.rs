//! A virtual-time simulator of a limiter fleet: 500 hosts, many tenants, the real share
//! state machine and allocator (limiter-fleet) and the kernel's GCRA (limiter-common),
//! driven through the failure situations of docs/design.md (Fleet state machine). `cargo
//! xtask sim` runs it and writes `target/sim/report.md`.

pub mod bootstrap;
pub mod bucket;
pub mod claims;
pub mod fleet;
pub mod metrics;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod time;
