//! `limiter top`: per-rule and global rates from two readings of the pinned maps.
//!
//! Reading goes through [`stats::collect`] (the counters, the share state as of now, the
//! rate in force: what `limiter stats` shows); [`rates`] turns two readings into rates
//! and is pure; [`view`] draws them and is pure too (a ratatui frame, tested on its
//! test backend). The terminal, the keys and the signals are the CLI's.

pub mod rates;
pub mod view;

use std::{path::Path, time::Duration};

pub use self::rates::{rates, Rates, Sample};
use crate::{bpf::maps::Maps, config::Unit, error::Error, observe::stats};

/// Refreshes `limiter top` accepts, in seconds (`--interval`).
pub const INTERVAL_RANGE_S: (f64, f64) = (0.1, 60.0);

/// `--interval SECONDS`: decimals allowed, within [`INTERVAL_RANGE_S`].
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let (low, high) = INTERVAL_RANGE_S;
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected seconds (e.g. 1 or 0.5), got {text:?}"))?;
    if !(low..=high).contains(&seconds) {
        return Err(format!(
            "must be between {low} and {high} seconds, got {text}"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// One reading of the maps pinned under `pin_dir`, taken at `at` (any fixed origin).
///
/// The pins are opened afresh on every reading: after `detach` + `run` the daemon pins
/// new maps, and maps opened once would keep showing the old ones, frozen.
pub fn read(pin_dir: &Path, at: Duration) -> Result<Sample, Error> {
    let maps = Maps::from_pins(pin_dir)?;
    let report = stats::collect(&maps)?;
    // `collect` has the counters but not the unit; a rule reloaded in between has no
    // unit here for one reading and is shown without one.
    let units = maps
        .live_rules()?
        .values()
        .filter_map(|rule| {
            let name = String::from_utf8_lossy(rule.name_bytes()).into_owned();
            Unit::from_abi(rule.unit).map(|unit| (name, unit))
        })
        .collect();
    Ok(Sample { at, report, units })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_outside_the_range_or_not_numbers_are_refused_by_name() {
        assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["0", "0.05", "61", "-1", "NaN", "inf", "one", ""] {
            let err = parse_interval(bad).expect_err(bad);
            assert!(
                err.contains("seconds"),
                "{bad}: the error says what is expected: {err}"
            );
        }
    }

    #[test]
    fn every_unit_is_read_back_from_its_map_value() {
        for unit in Unit::ALL {
            assert_eq!(Unit::from_abi(unit.abi()), Some(*unit));
        }
        assert_eq!(Unit::from_abi(u32::MAX), None);
    }
}
