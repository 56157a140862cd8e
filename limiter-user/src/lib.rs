//! The limiter daemon: configuration, rule compilation, loading the XDP program, and
//! reading its counters. The binary `limiter` is a thin CLI over this library.

pub mod config;
pub mod control;
pub mod daemon;
pub mod error;
pub mod explain;
pub mod fleet;
pub mod handoff;
pub mod kernel;
pub mod libxdp;
pub mod maps;
pub mod metrics;
pub mod netlink;
pub mod pins;
pub mod program;
pub mod ruleset;
pub mod sketch_regions;
pub mod stats;
pub mod takeover;
pub mod tc_filter;
pub mod verifier;

pub use error::Error;
