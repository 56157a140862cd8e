//! The limiter daemon: configuration, rule compilation, loading the XDP program, and
//! reading its counters. The binary `limiter` is a thin CLI over this library.
//!
//! The modules form layers. A module imports only from its own layer (never in a
//! circle) or from the layers below it; `tests/tests/layers.rs` reads this list and
//! fails on an import that goes up or round, and on a module the list does not place.
//!
//! 1. Definitions and probes: `config`, `object`, `hook`, `shutdown`, `sketch_regions`,
//!    `saturation`, `kernel`, `ruleset`, `reload_plan`, `verifier`, `privilege`, `error`.
//!    All pure but
//!    `kernel` and `privilege`, which ask the kernel what it supports and what this
//!    process may do, and `config`, which reads its file and the hostname.
//! 2. The kernel's objects (maps, programs, links, pins, hooks): `netlink`,
//!    `tc_filter`, `grace`, `maps`, `pins`, `handoff`, `libxdp`, `takeover`, `program`,
//!    `teardown`.
//! 3. State read from and written to the maps: `fleet` (pure), `stats`, `explain`,
//!    `top` (its rates and screen pure), `monitor` (the sampled refusals; its decoding,
//!    formats and rankings pure); and `relink` (pure), when to attach again to
//!    an interface created again under its name.
//! 4. The daemon, synchronous: `daemon`; and `reload_keys` (pure), which changed keys
//!    a reload leaves for the next start.
//! 5. The service loops on the async runtime: `control`, `metrics`, `reporter`,
//!    `service`.

pub mod config;
pub mod control;
pub mod daemon;
pub mod error;
pub mod explain;
pub mod fleet;
pub mod grace;
pub mod handoff;
pub mod hook;
pub mod kernel;
pub mod libxdp;
pub mod maps;
pub mod metrics;
pub mod monitor;
pub mod netlink;
pub mod object;
pub mod pins;
pub mod privilege;
pub mod program;
pub mod relink;
pub mod reload_keys;
pub mod reload_plan;
pub mod reporter;
pub mod ruleset;
pub mod saturation;
pub mod service;
pub mod shutdown;
pub mod sketch_regions;
pub mod stats;
pub mod takeover;
pub mod tc_filter;
pub mod teardown;
pub mod top;
pub mod verifier;

pub use error::{exit_status, Error};
