//! GCRA (virtual scheduling) in fixed point, shared by the XDP program and the host.
//!
//! Time is counted in *ticks* of 2^-6 ns. Whole nanoseconds are too coarse (a 64-byte
//! frame at 100 Gbit/s lasts 5.12 ns; 7 Mpps is one packet per 142.86 ns); 1/64 ns keeps
//! every per-packet rounding below 0.1 %. A u64 of ticks wraps after 2^58 ns (9.1 years);
//! every comparison is a wrapping difference, so uptime is unbounded (see [`conform`]).
//!
//! A bucket is one u64, its theoretical arrival time (TAT). A frame of cost `c` conforms
//! when `max(tat, now) + c - now <= tolerance`; then TAT advances by `c`. `tolerance` is
//! the cost of the burst, so exactly `burst` units pass from an idle bucket. Frames that
//! do not conform leave TAT alone (policing, not shaping). The kernel applies the new
//! TAT with a compare-and-swap, so concurrent CPUs can never admit more than one
//! sequential GCRA would.
//!
//! All rounding is towards admitting less: the interval and each frame's cost round up.

/// log2 of ticks per nanosecond.
pub const TICK_SHIFT: u32 = 6;
/// Ticks in one second.
pub const TICKS_PER_SECOND: u64 = 1_000_000_000 << TICK_SHIFT;
/// Fractional bits of [`Limit::interval`].
pub const FRAC_BITS: u32 = 16;
/// Highest accepted rate, in units per second (10^12: 8 Tbit/s in bytes).
pub const MAX_RATE: u64 = 1_000_000_000_000;
/// Largest tolerance (time to refill a whole burst): 2^61 ticks, about 1.1 years.
/// Keeping it far below 2^63 lets wrapping differences tell "ahead" from "behind".
pub const MAX_TOLERANCE: u64 = 1 << 61;

/// Converts CLOCK_MONOTONIC nanoseconds to ticks (wrapping).
#[inline(always)]
pub const fn ticks_from_ns(ns: u64) -> u64 {
    ns << TICK_SHIFT
}

/// Converts a tick count (a difference, not a timestamp) to nanoseconds, rounding down.
#[inline(always)]
pub const fn ns_from_ticks(ticks: u64) -> u64 {
    ticks >> TICK_SHIFT
}

/// What one unit of a rule is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// Each conforming event costs one unit (packets, SYNs).
    Event,
    /// Each frame costs its length in bytes.
    Byte,
}

/// A rate and burst compiled to the two numbers the kernel needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Ticks per unit with [`FRAC_BITS`] fractional bits (for `Event` limits the
    /// fraction is zero, so a packet costs a whole number of ticks).
    pub interval: u64,
    /// Ticks of cost a full bucket can absorb at once: `cost(burst)`.
    pub tolerance: u64,
}

/// Why a rate/burst pair cannot be compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    RateZero,
    RateTooHigh,
    BurstZero,
    /// The burst would take longer than [`MAX_TOLERANCE`] to refill.
    BurstTooLong,
}

impl core::fmt::Display for LimitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LimitError::RateZero => write!(f, "rate must be at least 1 per second"),
            LimitError::RateTooHigh => write!(f, "rate must be at most {MAX_RATE} per second"),
            LimitError::BurstZero => write!(f, "burst must be at least 1"),
            LimitError::BurstTooLong => write!(
                f,
                "burst takes more than a year to refill at this rate (burst / rate too large)"
            ),
        }
    }
}

impl Limit {
    /// No limit: never consulted (rules carry `RULE_HAS_*` flags).
    pub const NONE: Limit = Limit {
        interval: 0,
        tolerance: 0,
    };

    /// A share of zero: nothing conforms (every frame costs a tick, and the bucket
    /// tolerates none). A fleet grant of rate 0 compiles to this.
    pub const CLOSED: Limit = Limit {
        interval: 1 << FRAC_BITS,
        tolerance: 0,
    };

    /// Whether this is [`Limit::CLOSED`] (admits nothing).
    pub const fn is_closed(&self) -> bool {
        self.tolerance == 0 && self.interval != 0
    }

    /// Compiles `rate` units per second with a bucket of `burst` units.
    pub fn new(granularity: Granularity, rate: u64, burst: u64) -> Result<Limit, LimitError> {
        if rate == 0 {
            return Err(LimitError::RateZero);
        }
        if rate > MAX_RATE {
            return Err(LimitError::RateTooHigh);
        }
        if burst == 0 {
            return Err(LimitError::BurstZero);
        }
        let interval = match granularity {
            Granularity::Event => TICKS_PER_SECOND.div_ceil(rate) << FRAC_BITS,
            Granularity::Byte => (TICKS_PER_SECOND << FRAC_BITS).div_ceil(rate),
        };
        // ceil(burst * interval / 2^FRAC_BITS), in 128 bits: bursts are not bounded the
        // way frame lengths are.
        let tolerance = (burst as u128 * interval as u128).div_ceil(1 << FRAC_BITS);
        if tolerance > MAX_TOLERANCE as u128 {
            return Err(LimitError::BurstTooLong);
        }
        Ok(Limit {
            interval,
            tolerance: tolerance as u64,
        })
    }

    /// Ticks that `units` consume: `ceil(units * interval / 2^FRAC_BITS)`.
    ///
    /// Exact for `units <= MAX_COST_UNITS` (every frame length); wraps beyond. Plain
    /// 64-bit arithmetic on purpose: the BPF target has no 128-bit multiply, and the
    /// overflow checks of `checked_mul` would need one.
    #[inline(always)]
    pub const fn cost(&self, units: u64) -> u64 {
        let whole = self.interval >> FRAC_BITS;
        let frac = self.interval & ((1 << FRAC_BITS) - 1);
        let frac_ticks = (units.wrapping_mul(frac) + ((1 << FRAC_BITS) - 1)) >> FRAC_BITS;
        units.wrapping_mul(whole).wrapping_add(frac_ticks)
    }

    /// Whether this limit may be metered on the per-tick cached clock (see
    /// [`TICK_CLOCK_MIN_TOLERANCE`]).
    #[inline(always)]
    pub const fn tick_clock_ok(&self) -> bool {
        // A closed limit admits nothing at any time: it needs no precise clock.
        self.tolerance >= TICK_CLOCK_MIN_TOLERANCE || self.is_closed()
    }
}

/// Largest unit count [`Limit::cost`] computes exactly at any accepted rate
/// (`whole < 2^36` ticks per unit at 1 unit/s).
pub const MAX_COST_UNITS: u64 = 1 << 24;

/// The outcome of offering one frame to a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The frame conforms.
    pub admit: bool,
    /// The TAT to store (equal to the old one when nothing changes).
    pub tat: u64,
}

/// How far one CPU's clock reading may lag another's when both update one bucket: the
/// time between a CPU reading the clock and its compare-and-swap (a per-source insert, an
/// interrupt), and above all the lag of a [`crate::clock::TickClock`] reading (up to a
/// timer tick, 10 ms at HZ = 100, twice over when a tick is late). 2^31 ticks ≈ 33.6 ms.
pub const CLOCK_SKEW_MARGIN: u64 = 1 << 31;

/// Limits with at least this tolerance may be metered on the per-tick cached clock
/// ([`crate::clock::TickClock`]): a bucket that can hold a clock step's worth of units
/// loses nothing when the clock advances in steps. Smaller ones read the precise clock.
pub const TICK_CLOCK_MIN_TOLERANCE: u64 = CLOCK_SKEW_MARGIN;

/// One GCRA step for a frame of `cost` ticks arriving at `now`.
///
/// A TAT of 0 is a bucket never used (maps start zeroed): it is full. Otherwise
/// `tat - now` (wrapping) is read four ways:
/// - at or below zero (as a signed number): the bucket has refilled; start from `now`;
/// - within `tolerance`: the normal case; start from `tat`;
/// - up to [`CLOCK_SKEW_MARGIN`] beyond `tolerance`: another CPU read the clock a little
///   later and filled the bucket; this CPU's `now` is merely stale. Refuse and leave the
///   TAT alone: pulling it back to this older `now` would hand out credit;
/// - further beyond `tolerance`: either the limit was lowered since (a quota cut) or the
///   bucket sat idle so long (more than 4.5 years) that the difference wrapped. Both are
///   read as "bucket empty", and the TAT is pulled back to `now + tolerance`: a quota cut
///   is honoured at once, and a wrapped bucket costs at most one refill period of
///   accuracy, never an unbounded block.
#[inline(always)]
pub const fn conform(tat: u64, now: u64, cost: u64, tolerance: u64) -> Step {
    conform_within(tat, now, cost, tolerance, tolerance + CLOCK_SKEW_MARGIN)
}

/// [`conform`] with the point beyond which a TAT ahead of `now` is pulled back given
/// explicitly (`conform` uses `tolerance + CLOCK_SKEW_MARGIN`; a cell shared by rules of
/// different tolerances uses the largest tolerance any rule may have, see
/// [`crate::sketch::conform_cell`]). `reset_beyond` must be at least that.
#[inline(always)]
pub const fn conform_within(
    tat: u64,
    now: u64,
    cost: u64,
    tolerance: u64,
    reset_beyond: u64,
) -> Step {
    let ahead = tat.wrapping_sub(now);
    if ahead > tolerance && (ahead as i64) > 0 && tat != 0 {
        let tat = if ahead > reset_beyond {
            now.wrapping_add(tolerance)
        } else {
            tat
        };
        return Step { admit: false, tat };
    }
    let base = if tat == 0 || (ahead as i64) <= 0 {
        now
    } else {
        tat
    };
    let next = base.wrapping_add(cost);
    if next.wrapping_sub(now) <= tolerance {
        Step {
            admit: true,
            tat: next,
        }
    } else {
        Step { admit: false, tat }
    }
}

/// The TAT that leaves `tokens` units of burst available at `now` (tokens ≤ burst).
/// Used to start a share with a given token count instead of a full bucket.
pub const fn tat_with_tokens(limit: &Limit, now: u64, tokens: u64) -> u64 {
    let available = limit.cost(tokens);
    let used = limit.tolerance.saturating_sub(available);
    now.wrapping_add(used)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A sequential bucket, as one CPU would run it.
    struct Meter {
        limit: Limit,
        tat: u64,
    }

    impl Meter {
        fn new(limit: Limit) -> Self {
            Meter { limit, tat: 0 }
        }
        fn offer(&mut self, now: u64, units: u64) -> bool {
            let step = conform(self.tat, now, self.limit.cost(units), self.limit.tolerance);
            self.tat = step.tat;
            step.admit
        }
    }

    #[test]
    fn idle_bucket_passes_exactly_burst() {
        for burst in [1, 2, 20, 2000, 100_000] {
            let limit = Limit::new(Granularity::Event, 1, burst).unwrap();
            let mut m = Meter::new(limit);
            let now = ticks_from_ns(123_456_789_000);
            let passed = (0..burst + 1000).filter(|_| m.offer(now, 1)).count() as u64;
            assert_eq!(passed, burst);
        }
    }

    #[test]
    fn bytes_burst_is_exact() {
        let limit = Limit::new(Granularity::Byte, 1_000_000, 15_000).unwrap();
        let mut m = Meter::new(limit);
        let passed: u64 = (0..100).filter(|_| m.offer(1 << 40, 1500)).count() as u64;
        assert_eq!(passed * 1500, 15_000);
    }

    #[test]
    fn refills_at_rate() {
        // 1000/s, burst 1: one packet each millisecond, not one more.
        let limit = Limit::new(Granularity::Event, 1000, 1).unwrap();
        let mut m = Meter::new(limit);
        let start = ticks_from_ns(5_000_000_000);
        assert!(m.offer(start, 1));
        assert!(!m.offer(start + ticks_from_ns(999_999), 1));
        assert!(m.offer(start + ticks_from_ns(1_000_000), 1));
    }

    #[test]
    fn lowered_limit_is_honoured_at_once() {
        let high = Limit::new(Granularity::Event, 1000, 1000).unwrap();
        let low = Limit::new(Granularity::Event, 10, 1).unwrap();
        let mut m = Meter::new(high);
        let now = 1 << 50;
        for _ in 0..1000 {
            assert!(m.offer(now, 1));
        }
        // TAT is now a second ahead, far beyond the new tolerance: the bucket is empty.
        m.limit = low;
        assert!(!m.offer(now, 1));
        assert!(m.offer(now + low.tolerance, 1));
    }

    #[test]
    fn wrap_of_the_tick_counter_is_seamless() {
        let limit = Limit::new(Granularity::Event, 1_000_000, 10).unwrap();
        let mut m = Meter::new(limit);
        let step = limit.cost(1);
        let mut now = u64::MAX - 50 * step;
        let mut passed = 0;
        for _ in 0..100 {
            passed += u64::from(m.offer(now, 1));
            passed += u64::from(m.offer(now, 1)); // offered at twice the rate
            now = now.wrapping_add(step);
        }
        // 100 intervals plus the burst, minus the one interval not yet elapsed.
        assert!((109..=110).contains(&passed), "passed {passed}");
    }

    #[test]
    fn long_idle_buckets_refill() {
        let limit = Limit::new(Granularity::Event, 100, 5).unwrap();
        let year = ticks_from_ns(365 * 24 * 3600 * 1_000_000_000);
        for idle in [1, 2, 4] {
            let mut m = Meter::new(limit);
            let t0 = 7 << 40;
            for _ in 0..5 {
                assert!(m.offer(t0, 1));
            }
            let later = t0.wrapping_add(idle * year);
            let passed = (0..10).filter(|_| m.offer(later, 1)).count();
            assert_eq!(passed, 5, "after {idle} idle years");
        }
    }

    #[test]
    fn tokens_set_what_passes() {
        let limit = Limit::new(Granularity::Event, 20, 1).unwrap();
        let now = 99 << 30;
        let mut m = Meter::new(limit);
        m.tat = tat_with_tokens(&limit, now, 0);
        assert!(!m.offer(now, 1));
        m.tat = tat_with_tokens(&limit, now, 1);
        assert!(m.offer(now, 1));
        assert!(!m.offer(now, 1));
    }

    #[test]
    fn closed_admits_nothing_whatever_the_bucket_held() {
        let open = Limit::new(Granularity::Event, 1000, 100).unwrap();
        let now = ticks_from_ns(77_000_000_000);
        // A fresh bucket, one that was idle, one that was full, one far ahead (a cut).
        for tat in [
            0,
            now - ticks_from_ns(5_000_000_000),
            now + open.tolerance,
            now + ticks_from_ns(60_000_000_000),
        ] {
            let mut m = Meter::new(Limit::CLOSED);
            m.tat = tat;
            for i in 0..10_000u64 {
                let t = now + i * ticks_from_ns(1_000_000);
                assert!(!m.offer(t, 1), "tat {tat}: frame {i} admitted");
                assert!(!m.offer(t, 1500), "tat {tat}: a 1500-unit frame admitted");
            }
        }
        assert!(Limit::CLOSED.is_closed() && !open.is_closed() && !Limit::NONE.is_closed());
    }

    #[test]
    fn configuration_errors() {
        assert_eq!(
            Limit::new(Granularity::Event, 0, 1),
            Err(LimitError::RateZero)
        );
        assert_eq!(
            Limit::new(Granularity::Event, MAX_RATE + 1, 1),
            Err(LimitError::RateTooHigh)
        );
        assert_eq!(
            Limit::new(Granularity::Event, 1, 0),
            Err(LimitError::BurstZero)
        );
        assert_eq!(
            Limit::new(Granularity::Event, 1, 100_000_000),
            Err(LimitError::BurstTooLong)
        );
    }

    /// Rate a limit really enforces, as (numerator, denominator) units per second.
    fn effective_rate(limit: &Limit, units_per_frame: u64) -> (u128, u128) {
        (
            u128::from(TICKS_PER_SECOND) * u128::from(units_per_frame),
            u128::from(limit.cost(units_per_frame)),
        )
    }

    fn relative_error(limit: &Limit, rate: u64, units_per_frame: u64) -> f64 {
        let (num, den) = effective_rate(limit, units_per_frame);
        let eff = num as f64 / den as f64;
        (rate as f64 - eff).abs() / rate as f64
    }

    #[test]
    fn accuracy_across_the_range() {
        // Packets: 1/s .. 10M/s; bytes: 1 kbit/s .. 100 Gbit/s with 64-byte and 1500-byte
        // frames. Every step of the range, checked against the 0.5 % target.
        let mut worst: f64 = 0.0;
        let mut rate = 1u64;
        while rate <= 10_000_000 {
            for r in [rate, rate * 3 / 2 + 1, rate * 7 / 3 + 1] {
                let l = Limit::new(Granularity::Event, r, 1).unwrap();
                worst = worst.max(relative_error(&l, r, 1));
            }
            rate *= 10;
        }
        let mut bytes = 125u64;
        while bytes <= 12_500_000_000 {
            for b in [bytes, bytes * 3 / 2 + 1, bytes * 7 / 3 + 1] {
                let l = Limit::new(Granularity::Byte, b.min(12_500_000_000), 9000).unwrap();
                for frame in [64, 1500] {
                    worst = worst.max(relative_error(&l, b.min(12_500_000_000), frame));
                }
            }
            bytes *= 10;
        }
        assert!(worst < 0.005, "worst relative error {worst}");
    }

    fn simulate(limit: Limit, start: u64, gaps: &[(u64, u64)]) -> (u64, u64, u64) {
        let mut m = Meter::new(limit);
        let mut now = start;
        let mut admitted = 0;
        let mut offered = 0;
        for (i, &(gap, units)) in gaps.iter().enumerate() {
            if i > 0 {
                now = now.wrapping_add(gap);
            }
            offered += units;
            if m.offer(now, units) {
                admitted += units;
            }
        }
        let elapsed: u64 = gaps.iter().skip(1).map(|g| g.0).sum();
        (admitted, offered, elapsed)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Over any arrival trace, admitted <= rate * elapsed + burst (exact, in integers).
        #[test]
        fn never_admits_more_than_rate_times_time_plus_burst(
            bytes in any::<bool>(),
            rate in 1u64..20_000_000_000,
            burst in 1u64..100_000,
            start in any::<u64>(),
            gaps in prop::collection::vec((0u64..50_000_000, 1u64..9001), 1..600),
        ) {
            let granularity = if bytes { Granularity::Byte } else { Granularity::Event };
            let rate = if bytes { rate } else { rate % 10_000_000 + 1 };
            let burst = if bytes { burst.max(9000) } else { burst };
            let limit = match Limit::new(granularity, rate, burst) {
                Ok(l) => l,
                Err(LimitError::BurstTooLong) => return Ok(()),
                Err(e) => panic!("{e}"),
            };
            let gaps: Vec<(u64, u64)> =
                gaps.iter().map(|&(g, u)| (g, if bytes { u } else { 1 })).collect();
            let (admitted, _, elapsed) = simulate(limit, start, &gaps);
            let lhs = u128::from(admitted) * u128::from(TICKS_PER_SECOND);
            let rhs = u128::from(rate) * u128::from(elapsed)
                + u128::from(burst) * u128::from(TICKS_PER_SECOND);
            prop_assert!(lhs <= rhs, "admitted {admitted} elapsed {elapsed} ticks");
        }

        /// Offered steadily above the rate, admitted >= rate * elapsed - one frame,
        /// to within the 0.5 % accuracy bound. Holds for bursts of two frames or more: with
        /// room for less, a bucket that rejects a frame overflows before the next arrival
        /// (a property of every token bucket, not of the arithmetic).
        #[test]
        fn keeps_up_with_the_rate_when_offered_more(
            bytes in any::<bool>(),
            rate in 1u64..10_000_000,
            burst in 2u64..1000,
            overload_percent in 101u64..1000,
            frame in 64u64..1519,
            start in any::<u64>(),
        ) {
            let (granularity, rate, burst, units) = if bytes {
                (Granularity::Byte, rate * 1250, burst.max(2 * 1518), frame)
            } else {
                (Granularity::Event, rate, burst, 1)
            };
            let limit = Limit::new(granularity, rate, burst).unwrap();
            // Frames arrive `overload_percent` % faster than the rate, for 2000 frames.
            let gap = (u128::from(TICKS_PER_SECOND) * u128::from(units) * 100
                / (u128::from(rate) * u128::from(overload_percent))) as u64;
            let trace: Vec<(u64, u64)> = (0..2000).map(|_| (gap, units)).collect();
            let (admitted, offered, elapsed) = simulate(limit, start, &trace);
            let expected = u128::from(rate) * u128::from(elapsed) / u128::from(TICKS_PER_SECOND);
            let floor = (expected as f64 * 0.995) as u128;
            prop_assert!(
                u128::from(admitted) + u128::from(units) >= floor.min(u128::from(offered)),
                "admitted {admitted} expected {expected} offered {offered}"
            );
        }

        /// Several CPUs on one bucket, each reading the clock a little late (up to the
        /// skew margin) before its update: never more than rate × elapsed + burst.
        #[test]
        fn stale_clock_readings_never_over_admit(
            rate in 1u64..10_000_000,
            burst in 1u64..1000,
            events in prop::collection::vec((0u64..2_000_000, 0u64..CLOCK_SKEW_MARGIN), 1..3000),
            start in 1u64..u64::MAX / 2,
        ) {
            let limit = Limit::new(Granularity::Event, rate, burst).unwrap();
            let mut tat = 0u64;
            let mut t = start;
            let mut admitted = 0u64;
            for (gap, lag) in &events {
                t += gap;
                // This CPU read the clock `lag` ago; others may have updated since.
                let step = conform(tat, t - lag.min(&(t - start)), limit.cost(1), limit.tolerance);
                tat = step.tat;
                admitted += u64::from(step.admit);
            }
            let elapsed = t - start;
            let lhs = u128::from(admitted) * u128::from(TICKS_PER_SECOND);
            let rhs = u128::from(rate) * u128::from(elapsed + CLOCK_SKEW_MARGIN)
                + u128::from(burst) * u128::from(TICKS_PER_SECOND);
            prop_assert!(lhs <= rhs, "admitted {admitted} over {elapsed} ticks");
        }

        /// Below the rate nothing is dropped.
        #[test]
        fn under_the_rate_nothing_is_dropped(
            rate in 1u64..10_000_000,
            slack_percent in 1u64..90,
            start in any::<u64>(),
        ) {
            let limit = Limit::new(Granularity::Event, rate, 1).unwrap();
            let gap = TICKS_PER_SECOND / rate * 100 / (100 - slack_percent) + 1;
            let trace: Vec<(u64, u64)> = (0..1000).map(|_| (gap, 1)).collect();
            let (admitted, offered, _) = simulate(limit, start, &trace);
            prop_assert_eq!(admitted, offered);
        }
    }
}
