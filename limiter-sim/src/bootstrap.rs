//! The bootstrap bound: how much a joiner admits before its first grant, and so how many
//! joins a second keep the design's bootstrap figure (docs/design.md, Fleet state machine).
//! Scenarios size their join rates with it and claims check the runs against it.

use limiter_fleet::share::Share;

use crate::time::{NS_PER_S, STEP};

/// The design's bootstrap figure, percent of a second of quota: a host granted within
/// 50 ms of a rule's first frame adds at most about 0.9 % (docs/design.md, Fleet state
/// machine).
pub const BOOTSTRAP_CLAIM_PCT: f64 = 0.9;

/// How long a joiner stays in BOOTSTRAP with the allocator up: the grant's round trip,
/// plus up to one simulation step before the first frame is seen and the request sent.
pub fn grant_latency(rtt: u64) -> u64 {
    rtt + STEP
}

/// The most frames a joiner admits in BOOTSTRAP: its one token, then one frame per
/// bootstrap interval (quota ÷ fleet_size per second, burst 1) until its grant arrives
/// `grant_latency(rtt)` later: `1 + ⌊r_b × L⌋`. A first grant of 0 (the old leases hold
/// the quota) is closed, so nothing follows it until the others have renewed and the
/// host's next report gets it a share.
pub fn bootstrap_frames_per_joiner(quota: u64, fleet_size: u32, rtt: u64) -> u64 {
    let rate = Share::bootstrap_rate(quota, fleet_size);
    1 + u64::try_from(u128::from(rate) * u128::from(grant_latency(rtt)) / u128::from(NS_PER_S))
        .unwrap_or(u64::MAX)
}

/// The most joins per second for which the bootstrap bound stays within `pct` % of a
/// second of quota: `⌊pct × quota ÷ (1 + ⌊r_b × L⌋)⌋`.
pub fn joins_per_s_for(pct: f64, quota: u64, fleet_size: u32, rtt: u64) -> u32 {
    let per = bootstrap_frames_per_joiner(quota, fleet_size, rtt).max(1);
    (pct / 100.0 * quota as f64 / per as f64).floor() as u32
}
