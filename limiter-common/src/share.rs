//! The fleet share state of a rule: the one definition the map entry
//! ([`RuleConfig::share_state`](crate::abi::RuleConfig::share_state)), the fleet's share
//! state machine (limiter-fleet), `limiter stats`, `explain` and the metrics all use.
//!
//! The map holds the state as a `u32`: the discriminants below are ABI (a pinned entry
//! written by an earlier daemon is read with them), pinned by the assertion at the bottom.

use core::fmt;

/// Where a rule stands with the allocator. The names ([`ShareState::as_str`]) are the
/// user contract: `limiter stats` (`state`), `explain` and the metric label
/// `limiter_rule_share_state{state=…}` show them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareState {
    /// No `[fleet]`: the configured rate applies locally. A fleet rule's share is never
    /// standalone.
    Standalone = 0,
    /// No grant yet: quota ÷ fleet_size, burst 1.
    Bootstrap = 1,
    /// A grant whose lease has not lapsed.
    Leased = 2,
    /// The lease lapsed: the last share is kept.
    Sticky = 3,
    /// `fail_mode = "open"` after the sticky period: everything passes.
    FailOpen = 4,
}

impl ShareState {
    /// Every state, in the order of their values.
    pub const ALL: [ShareState; 5] = [
        ShareState::Standalone,
        ShareState::Bootstrap,
        ShareState::Leased,
        ShareState::Sticky,
        ShareState::FailOpen,
    ];

    /// The name users read (`limiter stats --json`, metrics, `explain`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ShareState::Standalone => "standalone",
            ShareState::Bootstrap => "bootstrap",
            ShareState::Leased => "leased",
            ShareState::Sticky => "sticky",
            ShareState::FailOpen => "fail_open",
        }
    }
}

impl fmt::Display for ShareState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ShareState> for u32 {
    /// The value a rule's map entry holds.
    fn from(state: ShareState) -> u32 {
        state as u32
    }
}

/// A map value that is no [`ShareState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownShareState(pub u32);

impl fmt::Display for UnknownShareState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown share state {} (known: 0 standalone to 4 fail_open)",
            self.0
        )
    }
}

impl core::error::Error for UnknownShareState {}

impl TryFrom<u32> for ShareState {
    type Error = UnknownShareState;

    fn try_from(value: u32) -> Result<ShareState, UnknownShareState> {
        ShareState::ALL
            .into_iter()
            .find(|s| *s as u32 == value)
            .ok_or(UnknownShareState(value))
    }
}

// The values pinned entries hold: changing one misreads every entry an earlier daemon
// wrote.
const _: () = {
    assert!(ShareState::Standalone as u32 == 0);
    assert!(ShareState::Bootstrap as u32 == 1);
    assert!(ShareState::Leased as u32 == 2);
    assert!(ShareState::Sticky as u32 == 3);
    assert!(ShareState::FailOpen as u32 == 4);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_map_value() {
        for state in ShareState::ALL {
            assert_eq!(ShareState::try_from(u32::from(state)), Ok(state));
        }
    }

    #[test]
    fn all_lists_each_state_once_at_the_index_of_its_value() {
        for (i, state) in ShareState::ALL.into_iter().enumerate() {
            assert_eq!(u32::from(state) as usize, i, "{state:?}");
        }
    }

    #[test]
    fn a_value_no_state_has_is_refused_by_name() {
        for value in [5, 6, 0x8000_0000, u32::MAX] {
            let err = ShareState::try_from(value).unwrap_err();
            assert_eq!(err, UnknownShareState(value));
            let message = format!("{err}");
            assert!(
                message.contains(&format!("unknown share state {value} ")),
                "{message}"
            );
        }
    }

    /// The names are the user contract (`limiter stats --json`, the metrics' `state`
    /// label): written out here so that renaming one fails a test.
    #[test]
    fn names_are_the_ones_users_read() {
        let names: Vec<&str> = ShareState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            ["standalone", "bootstrap", "leased", "sticky", "fail_open"]
        );
        assert_eq!(format!("{}", ShareState::FailOpen), "fail_open");
    }
}
