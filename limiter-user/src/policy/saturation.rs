//! When a rule's part of the per-source sketch is saturated, and what the gate says.
//!
//! A flood spread over forged sources fills a rule's cells (README, "Per-source limits"):
//! past a point, a fresh honest source finds both its cells exhausted and is refused
//! although it sends under its limit. Whether that point is reached is read from the
//! cells themselves: `q_row`, the share of the rule's cells in a row that would refuse
//! one more frame of the rule now. A source's two cells are hashed independently, so a
//! fresh source is refused with probability `q_row0 × q_row1`: the false-limit ratio.
//!
//! The estimate does not depend on what the rule does while saturated: a frame the
//! per-source limit refuses charges no cell, whether it is then dropped (`enforce`) or
//! passed on to the aggregate (`stand-aside`), so the cells evolve alike and the gate sees
//! the flood end either way. Pure: the daemon and `limiter stats` read the cells; the
//! arithmetic and the gate's decisions are here.

use std::time::{Duration, Instant};

use limiter_common::{abi::UNIT_BYTES, gcra::Limit, sketch};

use crate::config::MIN_BYTES_BURST;

/// Cells read per row of a rule's part at each check (all of a smaller part). 1,024 puts
/// the ratio's standard error near 1.4 × 10⁻³ at the entry threshold.
pub const SAMPLE_CELLS_PER_ROW: u32 = 1024;
/// Cells read per row at most over all rules at each check: many per-source rules share
/// it (each gets at least [`MIN_SAMPLE_CELLS_PER_ROW`]).
pub const SAMPLE_BUDGET_PER_ROW: u32 = 32 * 1024;
/// The fewest cells read per row of one rule.
pub const MIN_SAMPLE_CELLS_PER_ROW: u32 = 128;

/// A rule becomes saturated at this false-limit ratio: one fresh honest source in 100 is
/// refused. A sketch sized as the README says keeps it under 10⁻³.
pub const ENTER_RATIO: f64 = 0.01;
/// A saturated rule leaves once the ratio has stayed below this for [`CALM_FOR`].
pub const LEAVE_RATIO: f64 = 0.0025;
/// How long the ratio must stay below [`LEAVE_RATIO`] before a saturated rule leaves
/// (and at least how long it stays saturated): a flood that pauses shorter than this
/// does not make the rule flap, and each transition reinstalls the rule table.
pub const CALM_FOR: Duration = Duration::from_secs(3);

/// What one more frame of the rule costs a cell: one unit, or a full frame in bytes (the
/// frame a bytes rule's smallest burst must hold): a cell that refuses it refuses honest
/// full-size traffic, and overestimating saturation errs towards admitting.
pub fn probe_cost(unit: u32, limit: &Limit) -> u64 {
    let units = if unit == UNIT_BYTES {
        MIN_BYTES_BURST
    } else {
        1
    };
    limit.cost(units)
}

/// Whether a cell would refuse one more frame costing `cost` at `now` (ticks).
pub fn exhausted(tat: u64, now: u64, cost: u64, tolerance: u64) -> bool {
    !sketch::conform_cell(tat, now, cost, tolerance).admit
}

/// The cells of one rule's part read at one check: per row, how many were read and how
/// many were exhausted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub read: [u32; sketch::ROWS as usize],
    pub exhausted: [u32; sketch::ROWS as usize],
}

impl Sample {
    /// The share of a fresh source's chances of finding every one of its cells exhausted:
    /// the product of the rows' exhausted shares (rows hash independently). 0 when a row
    /// was not read.
    pub fn false_limit_ratio(&self) -> f64 {
        self.read
            .iter()
            .zip(&self.exhausted)
            .map(|(&read, &ex)| {
                if read == 0 {
                    0.0
                } else {
                    f64::from(ex.min(read)) / f64::from(read)
                }
            })
            .product()
    }
}

/// Which cells of a row's part of `part_width` cells to read (offsets within the part):
/// `count` of them spread evenly, starting at `phase` (varied between checks so that
/// successive checks read different cells).
pub fn sample_offsets(part_width: u32, count: u32, phase: u32) -> impl Iterator<Item = u32> {
    let count = count.clamp(1, part_width.max(1));
    let step = (part_width / count).max(1);
    let start = if step > 1 { phase % step } else { 0 };
    (0..count).map(move |i| (start + i * step) % part_width.max(1))
}

/// Cells per row to read for each of `rules` per-source rules.
pub fn cells_per_rule(rules: usize) -> u32 {
    let rules = u32::try_from(rules.max(1)).unwrap_or(u32::MAX);
    (SAMPLE_BUDGET_PER_ROW / rules).clamp(MIN_SAMPLE_CELLS_PER_ROW, SAMPLE_CELLS_PER_ROW)
}

/// Counts the exhausted cells among `tats` (a sample of one rule's part of each row).
pub fn sample_of(
    rows: [&[u64]; sketch::ROWS as usize],
    now: u64,
    limit: &Limit,
    unit: u32,
) -> Sample {
    let cost = probe_cost(unit, limit);
    let mut sample = Sample::default();
    for (row, tats) in rows.iter().enumerate() {
        sample.read[row] = u32::try_from(tats.len()).unwrap_or(u32::MAX);
        sample.exhausted[row] = u32::try_from(
            tats.iter()
                .filter(|&&tat| exhausted(tat, now, cost, limit.tolerance))
                .count(),
        )
        .unwrap_or(u32::MAX);
    }
    sample
}

/// A change of a rule's state, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Entered,
    Left,
}

/// One rule's hysteresis gate: saturated from the first check at or above
/// [`ENTER_RATIO`] (entering late refuses honest sources, so it is immediate), clear
/// again once every check for [`CALM_FOR`] read below [`LEAVE_RATIO`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gate {
    saturated: bool,
    /// Since when every check read below [`LEAVE_RATIO`] (while saturated).
    calm_since: Option<Instant>,
    /// The last estimate fed.
    ratio: f64,
    /// Transitions so far.
    transitions: u64,
}

impl Gate {
    /// A gate in the state a restart finds the rule's entry marked with (a daemon that
    /// restarts during a flood keeps the rule saturated; the calm spell starts afresh).
    pub fn resumed(saturated: bool) -> Gate {
        Gate {
            saturated,
            ..Gate::default()
        }
    }

    pub fn saturated(&self) -> bool {
        self.saturated
    }

    /// The last estimate fed (0 before any).
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    /// Feeds one check's estimate taken at `now`; returns the transition it caused.
    pub fn feed(&mut self, ratio: f64, now: Instant) -> Option<Transition> {
        // A NaN (never computed here) reads as no information: the state holds.
        let ratio = if ratio.is_nan() { self.ratio } else { ratio };
        self.ratio = ratio;
        if !self.saturated {
            if ratio >= ENTER_RATIO {
                self.saturated = true;
                self.calm_since = None;
                self.transitions += 1;
                return Some(Transition::Entered);
            }
            return None;
        }
        if ratio >= LEAVE_RATIO {
            self.calm_since = None;
            return None;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= CALM_FOR {
            self.saturated = false;
            self.calm_since = None;
            self.transitions += 1;
            return Some(Transition::Left);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::gcra::{self, Granularity};
    use proptest::prelude::*;

    use super::*;

    fn limit() -> Limit {
        Limit::new(Granularity::Event, 100, 10).unwrap_or(Limit::NONE)
    }

    const NOW: u64 = 1 << 45;

    #[test]
    fn a_cell_is_exhausted_when_one_more_frame_would_be_refused() {
        let l = limit();
        let cost = probe_cost(0, &l);
        assert!(!exhausted(0, NOW, cost, l.tolerance), "a cell never used");
        assert!(
            !exhausted(NOW - 1, NOW, cost, l.tolerance),
            "a cell at rest"
        );
        // Full but for one frame: admits it.
        assert!(!exhausted(NOW + l.tolerance - cost, NOW, cost, l.tolerance));
        // Less than one frame left.
        assert!(exhausted(
            NOW + l.tolerance - cost + 1,
            NOW,
            cost,
            l.tolerance
        ));
        assert!(exhausted(NOW + l.tolerance, NOW, cost, l.tolerance));
    }

    #[test]
    fn a_bytes_rule_probes_with_a_full_frame() {
        let l = Limit::new(Granularity::Byte, 1_000_000, 15_180).unwrap_or(Limit::NONE);
        assert_eq!(probe_cost(UNIT_BYTES, &l), l.cost(MIN_BYTES_BURST));
        assert_eq!(probe_cost(0, &limit()), limit().cost(1));
    }

    #[test]
    fn the_ratio_is_the_product_of_the_rows() {
        let s = Sample {
            read: [1000, 500],
            exhausted: [100, 250],
        };
        assert!((s.false_limit_ratio() - 0.05).abs() < 1e-12);
        let unread = Sample {
            read: [0, 10],
            exhausted: [0, 10],
        };
        assert_eq!(unread.false_limit_ratio(), 0.0);
    }

    #[test]
    fn sampling_reads_the_whole_of_a_small_part_and_spreads_over_a_large_one() {
        let all: Vec<u32> = sample_offsets(512, 1024, 7).collect();
        assert_eq!(all, (0..512).collect::<Vec<_>>());
        let spread: Vec<u32> = sample_offsets(1 << 20, 1024, 5).collect();
        assert_eq!(spread.len(), 1024);
        assert_eq!(spread[0], 5);
        assert_eq!(spread[1], 5 + 1024);
        assert!(spread.iter().all(|&o| o < 1 << 20));
        assert_eq!(cells_per_rule(1), SAMPLE_CELLS_PER_ROW);
        assert_eq!(cells_per_rule(1024), MIN_SAMPLE_CELLS_PER_ROW);
    }

    /// The estimate against the sketch arithmetic: cells filled by a flood of sources
    /// each held at their limit (H of them in W cells a row) are exhausted with
    /// probability 1 − e^(−H/W), and a fresh source, metered through `conform_cells`, is
    /// refused about as often as the estimate says.
    #[test]
    fn the_estimate_predicts_refusals_of_fresh_sources() {
        let l = limit();
        let width: u32 = 1 << 14;
        let meta = sketch::SketchMeta {
            seed: [0x5a7, 0x7a5],
            width_mask: width - 1,
            rows: sketch::ROWS,
        };
        let key = |a: u32| {
            let mut src = [0u8; 16];
            src[..4].copy_from_slice(&a.to_be_bytes());
            limiter_common::abi::SourceKey::masked(0, 4, &src, 32, 128)
        };
        let mut cells = vec![0u64; sketch::cells_for(width) as usize];
        // Flood sources send their whole burst at NOW: each leaves its cells exhausted.
        let heavy = width / 4;
        for a in 0..heavy {
            let index = sketch::cells_of(&meta, sketch::WHOLE_ROW, &key(a), &l);
            for _ in 0..20 {
                sketch::conform_cells(&mut cells, &index, NOW, l.cost(1), l.tolerance);
            }
        }
        let w = width as usize;
        let sample = sample_of([&cells[..w], &cells[w..]], NOW, &l, 0);
        let estimate = sample.false_limit_ratio();
        let expected = (1.0 - (-f64::from(heavy) / f64::from(width)).exp()).powi(2);
        assert!(
            (estimate - expected).abs() < 0.01,
            "estimate {estimate}, balls in bins {expected}"
        );
        let fresh = 20_000u32;
        let refused = (0..fresh)
            .filter(|&i| {
                let index = sketch::cells_of(&meta, sketch::WHOLE_ROW, &key(1 << 30 | i), &l);
                let mut probe = cells.clone();
                !sketch::conform_cells(&mut probe, &index, NOW, l.cost(1), l.tolerance)
            })
            .count();
        let measured = refused as f64 / f64::from(fresh);
        assert!(
            (measured - estimate).abs() < 0.01,
            "fresh sources refused {measured}, estimated {estimate}"
        );
        // Once every cell has drained (cells charged without deciding may run ahead of
        // the tolerance: they stay exhausted until then), nothing is exhausted.
        let drained = cells.iter().copied().max().unwrap_or(NOW);
        assert!(
            drained > NOW + l.tolerance,
            "some cell runs ahead of the tolerance"
        );
        let later = drained + gcra::ticks_from_ns(1_000_000);
        assert_eq!(
            sample_of([&cells[..w], &cells[w..]], later, &l, 0).false_limit_ratio(),
            0.0
        );
    }

    #[test]
    fn the_gate_enters_at_once_and_leaves_after_a_calm_spell() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut g = Gate::default();
        assert_eq!(g.feed(0.005, at(0)), None);
        assert_eq!(g.feed(ENTER_RATIO, at(250)), Some(Transition::Entered));
        assert!(g.saturated());
        // Between the thresholds: stays, and restarts the calm spell.
        assert_eq!(g.feed(0.001, at(500)), None);
        assert_eq!(g.feed(0.005, at(2_000)), None);
        assert_eq!(g.feed(0.001, at(2_250)), None);
        assert_eq!(g.feed(0.001, at(5_000)), None);
        assert_eq!(g.feed(0.001, at(5_250)), Some(Transition::Left));
        assert!(!g.saturated());
        assert_eq!(g.transitions(), 2);
    }

    proptest! {
        /// Whatever the estimates: the gate is saturated after any check at or above
        /// ENTER_RATIO, clear after any below LEAVE_RATIO while clear, never leaves less
        /// than CALM_FOR after a check at or above LEAVE_RATIO, and counts every change.
        #[test]
        fn the_gate_never_flaps(
            checks in proptest::collection::vec((0.0f64..0.05, 1u64..2_000), 1..200),
        ) {
            let mut g = Gate::default();
            let mut t = Instant::now();
            let mut last_busy: Option<Instant> = None;
            let mut changes = 0;
            for (ratio, gap_ms) in checks {
                t += Duration::from_millis(gap_ms);
                let was = g.saturated();
                let change = g.feed(ratio, t);
                prop_assert_eq!(change.is_some(), was != g.saturated());
                changes += u64::from(change.is_some());
                if ratio >= ENTER_RATIO {
                    prop_assert!(g.saturated());
                }
                if ratio >= LEAVE_RATIO {
                    last_busy = Some(t);
                }
                if change == Some(Transition::Left) {
                    prop_assert!(ratio < LEAVE_RATIO);
                    if let Some(busy) = last_busy {
                        prop_assert!(t.duration_since(busy) >= CALM_FOR);
                    }
                }
            }
            prop_assert_eq!(g.transitions(), changes);
        }
    }
}
