//! The TOML configuration file (docs/configuration.md; key names are a contract).
//!
//! - `words`: the enums keys are spelled as and the named defaults;
//! - [`schema`]: every key once, as rows (name, required or default, parser, help); a
//!   plain key's row also declares its field ([`schema::TopKeys`], [`schema::FleetKeys`]);
//! - `types`: the validated [`Config`];
//! - `check`: the walk that reads the file by those rows, on the checker both binaries
//!   share ([`limiter_config`]): every problem at once, each with its file, line, column
//!   and field path (`rules[1].per_source.burst`);
//! - `tests`: the cases, most as tables of (input, field, message) rows.
//!
//! Nothing here changes the system. [`Config::load`] reads the file; [`Config::parse`]
//! reads nothing but the kernel's hostname, the default `fleet.host_id`.

mod check;
pub mod schema;
#[cfg(test)]
mod tests;
mod types;
mod words;

pub use check::{parse_dst, parse_pin_index};
pub use limiter_config::{ConfigError, ConfigWord, Problem};
pub use schema::{FleetKeys, MonitorKeys, TopKeys};
pub use types::*;
pub use words::*;
