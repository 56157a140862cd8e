//! The limiter daemon: configuration, rule compilation, loading the XDP program, and
//! reading its counters. The binary `limiter` is a thin CLI over this library.
//!
//! The modules below are declared in the order data flows, from the config file to the
//! service loops, and each imports only from itself and the modules declared above it
//! (`tests/tests/layers.rs` reads this order and fails on an import that goes down the
//! list or round in a circle, at every level of folders).

/// The input: the config file's words, schema, types and checks.
pub mod config;

/// Pure: what the kernel must hold (compiled rules, sketch regions, fleet shares).
pub mod policy;

/// Read-only probes: kernel features, capabilities, the verifier's words, the objects.
pub mod host;

/// The daemon's error, which names what the layers above went wrong on.
pub mod error;

/// The objects the daemon owns: maps, pins.
pub mod bpf;

/// Hooks: loading and attaching the program, the handoff, teardown.
pub mod attach;

/// Readers of the maps: stats, explain, top, monitor.
pub mod observe;

/// The running state: start, reload, the fleet's shares, status.
pub mod daemon;

/// Async loops and exporters: control socket, metrics, fleet reports.
pub mod serve;

pub use error::{exit_status, Error};
