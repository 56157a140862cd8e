//! The config checker the daemon (`limiter`) and the allocator (`limiter-allocator`) both
//! use, in one copy.
//!
//! A file is parsed into toml's spanned document tree ([`toml::de::DeTable`]) and walked by
//! hand rather than through `#[derive(Deserialize)]`: serde stops at the first unknown key
//! or wrong type, while an operator fixing a config wants every problem at once. Each
//! [`Problem`] carries the line and column of the key or value it is about and the dotted
//! field path (`rules[1].per_source.burst`); [`ConfigError`] renders them as
//! `FILE:LINE:COLUMN: FIELD: MESSAGE`, one a line.
//!
//! The keys of each table are rows of a [`Section`] ([`schema`]): name, required or
//! default, parser, help. The unknown-key check, the defaults of absent keys and the
//! documentation tests read those rows, so a new key is one row plus the reading of its
//! value. Nothing here touches the system except [`read_file`], which only reads.
//!
//! A crate of its own rather than a module of `limiter-service`: the checker is pure and
//! synchronous (toml and thiserror only), the bottom layer of both binaries, while
//! `limiter-service` is their async serving plumbing (tokio, hyper); whatever reads a
//! config (a simulator, a test) need not build a server.

pub mod cases;
mod checker;
mod problem;
pub mod reference;
mod row;
pub mod schema;
mod word;

pub use checker::{At, Checker, Value};
pub use problem::{read_file, ConfigError, LineIndex, Problem, MAX_CONFIG_BYTES, MAX_PROBLEMS};
pub use row::{field_path, FromRow};
pub use schema::{Absent, Applies, Key, Kind, Section};
pub use toml;
pub use word::{unknown_value, ConfigWord};
