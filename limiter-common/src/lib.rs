//! The one definition of everything that crosses the kernel/user boundary.
//!
//! `abi` holds the `#[repr(C)]` map keys and values (no padding: flags are `u32`, every
//! struct is laid out by hand to a multiple of its alignment). `gcra` holds the rate
//! arithmetic and `clock` the per-tick cached clock it runs on; the XDP program and the
//! host tests call the same functions. `dispatcher` is libxdp's multi-program dispatcher
//! configuration, shared by the limiter's dispatcher program and the daemon. `sketch` holds
//! the per-source cells (layout, hash, the cell step). `share` holds a rule's fleet share
//! state, whose values its map entry carries. `drop` holds the reasons a frame is refused
//! and the sampled drop event. `maps` is the one table of the program's maps (name,
//! kind, key and value sizes, flags, entries) that the kernel's declarations and the
//! daemon's layout check, pins and map set read. `rule_name` is the grammar of a rule's name. `canary` picks the sources a rule enforces for when it
//! enforces for a fraction of them.
#![cfg_attr(not(test), no_std)]

pub mod abi;
pub mod canary;
pub mod clock;
pub mod dispatcher;
pub mod drop;
pub mod gcra;
pub mod maps;
pub mod rule_name;
pub mod share;
pub mod sketch;
