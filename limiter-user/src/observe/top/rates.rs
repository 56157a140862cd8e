//! Counter deltas over elapsed time, per rule and for the global counters.
//!
//! The counters only grow while the maps live. They go backwards when the maps are
//! recreated (`detach` + `run`) or a rule is removed and added again (its new slot starts
//! at zero); a delta taken across that would be negative, or huge as a wrapped `u64`.
//! Such a counter restarted within the interval, so what it holds now was all counted
//! within it: the rate is that over the interval (a lower bound, never above the truth),
//! and the row is marked.

use std::{collections::BTreeMap, time::Duration};

use crate::{
    config::Unit,
    observe::stats::{GlobalStats, RuleStats, StatsReport},
};

/// An interval shorter than this gives no rate (a refresh forced by a key, a clock
/// that did not move): the quotient would be noise.
pub const MIN_ELAPSED: Duration = Duration::from_millis(10);

/// One reading of the maps.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// When it was read, on a monotonic clock from any fixed origin.
    pub at: Duration,
    pub report: StatsReport,
    /// Each rule's unit (`packets`, `bytes`, `syn`) by rule name, where known.
    pub units: BTreeMap<String, Unit>,
}

/// A counter's rate over one interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterRate {
    pub per_second: f64,
    /// The counter went backwards: it restarted within the interval and the rate
    /// counts only what it counted since.
    pub restarted: bool,
}

/// The rate of a counter read as `before` and then, `elapsed` later, as `after`; None
/// for an interval shorter than [`MIN_ELAPSED`].
pub fn counter_rate(before: u64, after: u64, elapsed: Duration) -> Option<CounterRate> {
    if elapsed < MIN_ELAPSED {
        return None;
    }
    let (delta, restarted) = match after.checked_sub(before) {
        Some(delta) => (delta, false),
        None => (after, true),
    };
    Some(CounterRate {
        per_second: delta as f64 / elapsed.as_secs_f64(),
        restarted,
    })
}

/// A rule's six counters, as totals or per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic<T> {
    pub passed_packets: T,
    pub passed_bytes: T,
    pub dropped_packets: T,
    pub dropped_bytes: T,
    pub would_drop_packets: T,
    pub would_drop_bytes: T,
}

impl Traffic<u64> {
    pub fn of(rule: &RuleStats) -> Traffic<u64> {
        Traffic {
            passed_packets: rule.counters.passed_packets,
            passed_bytes: rule.counters.passed_bytes,
            dropped_packets: rule.counters.dropped_packets,
            dropped_bytes: rule.counters.dropped_bytes,
            would_drop_packets: rule.counters.would_drop_packets,
            would_drop_bytes: rule.counters.would_drop_bytes,
        }
    }

    fn fields(&self) -> [u64; 6] {
        [
            self.passed_packets,
            self.passed_bytes,
            self.dropped_packets,
            self.dropped_bytes,
            self.would_drop_packets,
            self.would_drop_bytes,
        ]
    }
}

impl<T: Copy> Traffic<T> {
    fn from_fields([a, b, c, d, e, f]: [T; 6]) -> Traffic<T> {
        Traffic {
            passed_packets: a,
            passed_bytes: b,
            dropped_packets: c,
            dropped_bytes: d,
            would_drop_packets: e,
            would_drop_bytes: f,
        }
    }
}

/// What a rule's rates are measured from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The previous reading: the whole interval.
    Interval,
    /// The rule was not in the previous reading (added by a reload): its counters
    /// started at zero within the interval.
    Appeared,
    /// A counter of the rule went backwards (see the module's doc): every counter of
    /// the rule is measured from zero, so passed and dropped share one baseline.
    Restarted,
}

/// One rule as `limiter top` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleRates {
    /// The current reading: name, mode, share state, rate in force, totals.
    pub stats: RuleStats,
    pub unit: Option<Unit>,
    /// None on the first reading, or over an interval too short to measure.
    pub per_second: Option<Traffic<f64>>,
    pub baseline: Baseline,
}

/// One global counter: its total and its rate.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalRate {
    /// The counter's key in `limiter stats --json`'s `global`.
    pub name: &'static str,
    pub total: u64,
    pub per_second: Option<CounterRate>,
}

/// Everything one screen of `limiter top` shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Rates {
    /// The interval the rates cover; None on the first reading.
    pub elapsed: Option<Duration>,
    /// The current reading's rules, in its order (slot order).
    pub rules: Vec<RuleRates>,
    /// Rules of the previous reading that are gone from this one (removed by a reload).
    pub gone: Vec<String>,
    pub global: Vec<GlobalRate>,
    pub bypass: bool,
    /// A gauge, not a counter: shown as it is.
    pub sketch_busy_ppm: u64,
}

/// The global counters by their `stats --json` keys, in its order; `sketch_busy_ppm` is
/// a gauge and not among them.
pub fn global_counters(g: &GlobalStats) -> Vec<(&'static str, u64)> {
    let mut all: Vec<(&'static str, u64)> = g.counters.named().to_vec();
    all.extend(g.headers.named());
    all.extend([
        ("handoff_missing", g.handoff_missing),
        ("new_sources", g.new_sources),
        ("source_refusals", g.source_refusals),
    ]);
    all
}

fn rule_rates(
    before: Option<&RuleStats>,
    after: &RuleStats,
    elapsed: Duration,
) -> (Option<Traffic<f64>>, Baseline) {
    let now = Traffic::of(after).fields();
    let (then, mut baseline) = match before {
        Some(rule) => (Traffic::of(rule).fields(), Baseline::Interval),
        None => ([0; 6], Baseline::Appeared),
    };
    if now.iter().zip(&then).any(|(n, t)| n < t) {
        baseline = Baseline::Restarted;
    }
    let from = if baseline == Baseline::Restarted {
        [0; 6]
    } else {
        then
    };
    let mut per_second = [0.0; 6];
    for i in 0..6 {
        match counter_rate(from[i], now[i], elapsed) {
            Some(r) => per_second[i] = r.per_second,
            None => return (None, baseline),
        }
    }
    (Some(Traffic::from_fields(per_second)), baseline)
}

/// The rates between two readings (`before`: None on the first one). Rules are matched
/// by name.
pub fn rates(before: Option<&Sample>, after: &Sample) -> Rates {
    let elapsed = before.map(|b| after.at.saturating_sub(b.at));
    let previous: BTreeMap<&str, &RuleStats> = before
        .map(|b| {
            b.report
                .rules
                .iter()
                .map(|r| (r.name.as_str(), r))
                .collect()
        })
        .unwrap_or_default();
    let rules = after
        .report
        .rules
        .iter()
        .map(|rule| {
            let unit = after.units.get(&rule.name).copied();
            let (per_second, baseline) = match elapsed {
                Some(elapsed) => {
                    rule_rates(previous.get(rule.name.as_str()).copied(), rule, elapsed)
                }
                None => (None, Baseline::Interval),
            };
            RuleRates {
                stats: rule.clone(),
                unit,
                per_second,
                baseline,
            }
        })
        .collect();
    let gone = before
        .map(|b| {
            b.report
                .rules
                .iter()
                .filter(|r| !after.report.rules.iter().any(|a| a.name == r.name))
                .map(|r| r.name.clone())
                .collect()
        })
        .unwrap_or_default();
    let then = before.map(|b| global_counters(&b.report.global));
    let global = global_counters(&after.report.global)
        .into_iter()
        .enumerate()
        .map(|(i, (name, total))| GlobalRate {
            name,
            total,
            per_second: then
                .as_ref()
                .zip(elapsed)
                .and_then(|(then, elapsed)| counter_rate(then[i].1, total, elapsed)),
        })
        .collect();
    Rates {
        elapsed,
        rules,
        gone,
        global,
        bypass: after.report.bypass,
        sketch_busy_ppm: after.report.global.sketch_busy_ppm,
    }
}

/// A figure in at most 6 characters: exact below 100,000, then three significant
/// digits with k, M, G, T (powers of 1000; a rate of bytes reads `125M` for 125 MB/s).
pub fn compact(value: f64) -> String {
    if !value.is_finite() || value < 0.0 {
        return "?".to_string();
    }
    if value < 99_999.5 {
        return format!("{value:.0}");
    }
    let mut scaled = value;
    for suffix in ["k", "M", "G", "T", "P", "E"] {
        scaled /= 1000.0;
        // Rounding to three digits may carry into the next prefix (999.96k → 1000k).
        if scaled < 999.5 || suffix == "E" {
            return if scaled < 9.995 {
                format!("{scaled:.2}{suffix}")
            } else if scaled < 99.95 {
                format!("{scaled:.1}{suffix}")
            } else {
                format!("{scaled:.0}{suffix}")
            };
        }
    }
    unreachable!("the loop returns at its last suffix")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use limiter_common::abi::{GlobalCounters, HeaderCounters, RuleCounters};
    use proptest::prelude::*;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn rule(name: &str, passed: u64, dropped: u64) -> RuleStats {
        RuleStats {
            name: name.to_string(),
            mode: crate::config::Mode::Enforce,
            enforce_percent: crate::config::Percent::ALL,
            state: limiter_common::share::ShareState::Standalone,
            rate: Some(1000),
            burst: Some(100),
            counters: RuleCounters {
                passed_packets: passed,
                passed_bytes: passed * 100,
                dropped_packets: dropped,
                dropped_bytes: dropped * 100,
                would_drop_packets: 0,
                would_drop_bytes: 0,
                refused_early_packets: 0,
                refused_early_bytes: 0,
            },
            sources_saturated: None,
            sources_aside: false,
            sources_false_limit_ppm: None,
            reasons: Default::default(),
        }
    }

    fn global(malformed: u64, new_sources: u64) -> GlobalStats {
        GlobalStats {
            counters: GlobalCounters {
                malformed,
                ..GlobalCounters::default()
            },
            headers: HeaderCounters::default(),
            tunnels: Default::default(),
            handoff_missing: 0,
            new_sources,
            source_refusals: 0,
            sketch_busy_ppm: 0,
            no_rule_reasons: Default::default(),
            monitor: Default::default(),
        }
    }

    fn sample(at: Duration, rules: Vec<RuleStats>, global: GlobalStats) -> Sample {
        let units = rules
            .iter()
            .map(|r| (r.name.clone(), Unit::Packets))
            .collect();
        Sample {
            at,
            report: StatsReport {
                rules,
                global,
                bypass: false,
            },
            units,
        }
    }

    #[test]
    fn a_rate_is_the_delta_over_the_elapsed_time() {
        let r = counter_rate(1_000, 4_000, Duration::from_millis(1500)).unwrap();
        assert_eq!(r.per_second, 3_000.0 / 1.5);
        assert!(!r.restarted);
        assert_eq!(counter_rate(7, 7, SECOND).unwrap().per_second, 0.0);
    }

    /// Maps recreated by `detach` + `run`: the counter now holds less than before. A
    /// wrapped `u64` delta would read ~1.8e19/s; the rate is what it counted since.
    #[test]
    fn a_counter_that_goes_backwards_counts_from_its_restart() {
        let r = counter_rate(5_000_000, 300, Duration::from_secs(2)).unwrap();
        assert!(r.restarted);
        assert_eq!(r.per_second, 150.0);
        let r = counter_rate(u64::MAX, 0, SECOND).unwrap();
        assert_eq!((r.per_second, r.restarted), (0.0, true));
    }

    #[test]
    fn an_interval_too_short_to_measure_gives_no_rate() {
        assert_eq!(counter_rate(0, 10, Duration::ZERO), None);
        assert_eq!(counter_rate(0, 10, MIN_ELAPSED / 2), None);
        let two = sample(SECOND, vec![rule("web", 10, 0)], global(0, 0));
        let rates = rates(Some(&two), &two);
        assert_eq!(rates.rules[0].per_second, None);
        assert!(rates.global.iter().all(|g| g.per_second.is_none()));
    }

    #[test]
    fn the_first_reading_has_totals_but_no_rates() {
        let first = sample(SECOND, vec![rule("web", 10, 5)], global(3, 0));
        let rates = rates(None, &first);
        assert_eq!(rates.elapsed, None);
        assert_eq!(rates.rules[0].per_second, None);
        assert_eq!(rates.rules[0].stats.counters.dropped_packets, 5);
        assert_eq!(rates.global[0].total, 3);
        assert_eq!(rates.global[0].per_second, None);
    }

    #[test]
    fn rule_and_global_rates_between_two_readings() {
        let before = sample(
            Duration::from_secs(10),
            vec![rule("web", 1_000, 0), rule("dns", 50, 50)],
            global(4, 100),
        );
        let after = sample(
            Duration::from_secs(12),
            vec![rule("web", 3_000, 6_000), rule("dns", 50, 50)],
            global(10, 700),
        );
        let rates = rates(Some(&before), &after);
        assert_eq!(rates.elapsed, Some(Duration::from_secs(2)));
        let web = rates.rules[0].per_second.unwrap();
        assert_eq!(web.passed_packets, 2_000.0 / 2.0);
        assert_eq!(web.passed_bytes, 200_000.0 / 2.0);
        assert_eq!(web.dropped_packets, 6_000.0 / 2.0);
        assert_eq!(rates.rules[0].baseline, Baseline::Interval);
        assert_eq!(rates.rules[0].unit, Some(Unit::Packets));
        assert_eq!(rates.rules[1].per_second.unwrap(), Traffic::default());
        let by_name = |n: &str| rates.global.iter().find(|g| g.name == n).unwrap();
        assert_eq!(by_name("malformed").per_second.unwrap().per_second, 3.0);
        assert_eq!(by_name("new_sources").per_second.unwrap().per_second, 300.0);
        assert_eq!(by_name("new_sources").total, 700);
        assert!(rates.gone.is_empty());
    }

    /// A reload between two readings removes `dns` and adds `api` (its counters start
    /// at zero in its slot): `api` is measured from zero and marked, `dns` is listed as
    /// gone and nothing of it is shown as a rule.
    #[test]
    fn a_rule_that_appears_or_disappears_between_two_readings() {
        let before = sample(
            SECOND,
            vec![rule("web", 100, 0), rule("dns", 9_000, 9_000)],
            global(0, 0),
        );
        let after = sample(
            Duration::from_secs(2),
            vec![rule("web", 200, 0), rule("api", 40, 10)],
            global(0, 0),
        );
        let rates = rates(Some(&before), &after);
        let names: Vec<&str> = rates.rules.iter().map(|r| r.stats.name.as_str()).collect();
        assert_eq!(names, ["web", "api"]);
        assert_eq!(rates.gone, ["dns"]);
        let api = &rates.rules[1];
        assert_eq!(api.baseline, Baseline::Appeared);
        assert_eq!(api.per_second.unwrap().passed_packets, 40.0);
        assert_eq!(api.per_second.unwrap().dropped_packets, 10.0);
        assert_eq!(rates.rules[0].baseline, Baseline::Interval);
    }

    /// `detach` + `run` between two readings: every counter restarted. No rate is
    /// negative or huge; each is what the new maps counted, over the interval.
    #[test]
    fn maps_recreated_between_two_readings() {
        let before = sample(
            SECOND,
            vec![rule("web", 1_000_000, 2_000_000)],
            global(500, 90_000),
        );
        let after = sample(
            Duration::from_secs(3),
            vec![rule("web", 800, 2_400_000)],
            global(2, 10),
        );
        let rates = rates(Some(&before), &after);
        let web = &rates.rules[0];
        assert_eq!(web.baseline, Baseline::Restarted);
        let per_second = web.per_second.unwrap();
        // Passed went backwards, so dropped is measured from zero too (one baseline).
        assert_eq!(per_second.passed_packets, 800.0 / 2.0);
        assert_eq!(per_second.dropped_packets, 2_400_000.0 / 2.0);
        for g in &rates.global[..1] {
            let r = g.per_second.unwrap();
            assert!(r.restarted);
            assert_eq!(r.per_second, g.total as f64 / 2.0);
        }
    }

    #[test]
    fn compact_figures_keep_three_digits_and_fit_six_characters() {
        let cases = [
            (0.0, "0"),
            (12.4, "12"),
            (99_999.0, "99999"),
            (100_000.0, "100k"),
            (125_000_000.0, "125M"),
            (1_234_567.0, "1.23M"),
            (12_345_678.0, "12.3M"),
            (999_999.0, "1.00M"),
            (f64::NAN, "?"),
            (-1.0, "?"),
        ];
        for (value, want) in cases {
            assert_eq!(compact(value), want, "{value}");
        }
    }

    /// Reads a [`compact`] figure back (for the tests that read a screen).
    fn parse_compact(text: &str) -> f64 {
        let (digits, scale) = match text.chars().last().unwrap() {
            'k' => (&text[..text.len() - 1], 1e3),
            'M' => (&text[..text.len() - 1], 1e6),
            'G' => (&text[..text.len() - 1], 1e9),
            'T' => (&text[..text.len() - 1], 1e12),
            'P' => (&text[..text.len() - 1], 1e15),
            'E' => (&text[..text.len() - 1], 1e18),
            _ => (text, 1.0),
        };
        digits.parse::<f64>().unwrap() * scale
    }

    proptest! {
        /// Whatever two readings of a counter hold: the rate is finite, never negative,
        /// never more than the counter holds now over the interval, and exactly the
        /// delta over the interval when the counter did not go backwards.
        #[test]
        fn a_rate_is_never_negative_nor_more_than_the_counter_holds(
            before in any::<u64>(),
            after in any::<u64>(),
            elapsed_us in 10_000u64..3_600_000_000,
        ) {
            let elapsed = Duration::from_micros(elapsed_us);
            let r = counter_rate(before, after, elapsed).unwrap();
            let secs = elapsed.as_secs_f64();
            prop_assert!(r.per_second.is_finite() && r.per_second >= 0.0);
            prop_assert!(r.per_second * secs <= after as f64 * (1.0 + 1e-12));
            prop_assert_eq!(r.restarted, after < before);
            if after >= before {
                let delta = (after - before) as f64;
                prop_assert!((r.per_second * secs - delta).abs() <= delta * 1e-12 + 1e-6);
            }
        }

        /// A counter that only grows, read three times: the rate over the whole span is
        /// the time-weighted mean of the rates over its two parts.
        #[test]
        fn rates_over_adjacent_intervals_add_up(
            c0 in 0u64..1 << 50,
            d1 in 0u64..1 << 40,
            d2 in 0u64..1 << 40,
            t1_ms in 10u64..100_000,
            t2_ms in 10u64..100_000,
        ) {
            let (t1, t2) = (Duration::from_millis(t1_ms), Duration::from_millis(t2_ms));
            let first = counter_rate(c0, c0 + d1, t1).unwrap().per_second;
            let second = counter_rate(c0 + d1, c0 + d1 + d2, t2).unwrap().per_second;
            let whole = counter_rate(c0, c0 + d1 + d2, t1 + t2).unwrap().per_second;
            let mean = (first * t1.as_secs_f64() + second * t2.as_secs_f64())
                / (t1 + t2).as_secs_f64();
            prop_assert!((whole - mean).abs() <= whole.abs() * 1e-9 + 1e-9);
        }

        /// Any two sets of rule names: the screen shows exactly the current reading's
        /// rules in its order, lists exactly the vanished ones as gone, and marks as
        /// appeared exactly the new ones; no rate is negative.
        #[test]
        fn rules_are_matched_by_name_between_readings(
            before in proptest::collection::btree_map("[a-e]", (any::<u32>(), any::<u32>()), 0..5),
            after in proptest::collection::btree_map("[a-e]", (any::<u32>(), any::<u32>()), 0..5),
        ) {
            let to_rules = |m: &BTreeMap<String, (u32, u32)>| -> Vec<RuleStats> {
                m.iter().map(|(n, (p, d))| rule(n, u64::from(*p), u64::from(*d))).collect()
            };
            let b = sample(SECOND, to_rules(&before), global(0, 0));
            let a = sample(Duration::from_secs(2), to_rules(&after), global(0, 0));
            let rates = rates(Some(&b), &a);
            let shown: Vec<&String> = rates.rules.iter().map(|r| &r.stats.name).collect();
            prop_assert_eq!(shown, after.keys().collect::<Vec<_>>());
            let gone: Vec<&String> = before.keys().filter(|n| !after.contains_key(*n)).collect();
            prop_assert_eq!(rates.gone.iter().collect::<Vec<_>>(), gone);
            for r in &rates.rules {
                prop_assert_eq!(
                    r.baseline == Baseline::Appeared,
                    !before.contains_key(&r.stats.name)
                );
                let p = r.per_second.unwrap();
                prop_assert!(p.passed_packets >= 0.0 && p.dropped_packets >= 0.0);
            }
        }

        /// A compact figure is at most 6 characters and reads back within 0.5 %.
        #[test]
        fn compact_reads_back_within_half_a_percent(value in 0.0f64..1e20) {
            let text = compact(value);
            prop_assert!(text.len() <= 6, "{}", text);
            let back = parse_compact(&text);
            prop_assert!((back - value).abs() <= value * 0.005 + 0.5, "{} -> {}", value, text);
        }
    }
}
