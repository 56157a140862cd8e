//! Pure bounds on what one peer may cost: a report-rate bucket and a log budget. Time is
//! passed in (monotonic ns), so both are tested without a clock.

use limiter_common::gcra::{self, Granularity, Limit};

/// A report-rate bucket: `rate` events per second, up to `burst` at once, metered by the
/// project's one rate arithmetic (limiter_common::gcra, what the XDP program meters
/// with) over monotonic nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportBucket {
    limit: Limit,
    /// Theoretical arrival time, in gcra ticks (0: never used, full).
    tat: u64,
}

impl ReportBucket {
    /// A full bucket. `rate` and `burst` are clamped to what a limit can hold (at least
    /// 1; a burst of at most an hour of the rate).
    pub fn new(rate: u64, burst: u64) -> ReportBucket {
        let rate = rate.clamp(1, gcra::MAX_RATE);
        let burst = burst.clamp(1, rate.saturating_mul(3600));
        // Unreachable after the clamps; a closed bucket would be the safe side.
        let limit = Limit::new(Granularity::Event, rate, burst).unwrap_or(Limit::CLOSED);
        ReportBucket { limit, tat: 0 }
    }

    /// Takes one event's token if there is one.
    pub fn allow(&mut self, now_ns: u64) -> bool {
        let step = gcra::conform(
            self.tat,
            gcra::ticks_from_ns(now_ns),
            self.limit.cost(1),
            self.limit.tolerance,
        );
        self.tat = step.tat;
        step.admit
    }
}

/// At most `per_window` log lines per window; what is held back is counted and told with
/// the next line that is let through, so a flood of bad peers cannot fill the journal and
/// still shows in it.
#[derive(Clone, Debug)]
pub struct LogBudget {
    window: u64,
    per_window: u32,
    window_start: u64,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    pub fn new(window_ns: u64, per_window: u32) -> LogBudget {
        LogBudget {
            window: window_ns.max(1),
            per_window,
            window_start: 0,
            used: 0,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log this one, saying `n` lines were held back since the last one; `None`:
    /// hold it back.
    pub fn admit(&mut self, now: u64) -> Option<u64> {
        if now.saturating_sub(self.window_start) >= self.window {
            self.window_start = now;
            self.used = 0;
        }
        if self.used < self.per_window {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let mut b = ReportBucket::new(10, 5);
        assert_eq!((0..20).filter(|_| b.allow(0)).count(), 5);
        // 100 ms buys one report at 10/s.
        assert!(!b.allow(S / 10 - 1));
        assert!(b.allow(S / 10));
        assert!(!b.allow(S / 10));
        // A long silence refills to the burst, not beyond.
        assert_eq!((0..20).filter(|_| b.allow(100 * S)).count(), 5);
        // Time going backwards (it cannot, but) gives no credit.
        assert!(!b.allow(50 * S));
    }

    proptest! {
        /// Over any schedule, a bucket allows at most burst + rate × elapsed events.
        #[test]
        fn a_bucket_never_allows_more_than_burst_plus_rate(
            rate in 1u64..1000,
            burst in 1u64..50,
            gaps in prop::collection::vec(0u64..20_000_000, 1..2000),
        ) {
            let mut b = ReportBucket::new(rate, burst);
            let (mut now, mut allowed) = (0u64, 0u64);
            for gap in gaps {
                now += gap;
                allowed += u64::from(b.allow(now));
            }
            let bound = burst + (u128::from(now) * u128::from(rate) / u128::from(S)) as u64 + 1;
            prop_assert!(allowed <= bound, "{} > {}", allowed, bound);
        }
    }

    #[test]
    fn the_log_budget_holds_back_a_flood_and_says_how_much() {
        let mut log = LogBudget::new(10 * S, 3);
        let let_through: Vec<Option<u64>> = (0..1000).map(|i| log.admit(i)).collect();
        assert_eq!(let_through.iter().filter(|l| l.is_some()).count(), 3);
        assert_eq!(let_through[0], Some(0));
        // The next window's first line counts what the last one held back.
        assert_eq!(log.admit(10 * S), Some(997));
        assert_eq!(log.admit(10 * S + 1), Some(0));
    }
}
