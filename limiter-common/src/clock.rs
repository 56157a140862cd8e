//! The XDP program's cheap clock: CLOCK_MONOTONIC read once per timer tick per CPU.
//!
//! Reading the precise clock (`bpf_ktime_get_ns`) is a helper call into the timekeeping
//! code, measured at ≈ 35 ns per frame here (a third of the program's cost on the hot path;
//! return-thunk mitigations make every kernel call and return dear). `bpf_jiffies64` is
//! inlined by the verifier into one load. A [`TickClock`] keeps, per CPU, the precise time
//! read at the first frame of the current jiffy and hands it out until jiffies moves on.
//!
//! What the GCRA sees is then a clock that advances in steps of about one tick and lags the
//! true time by at most a tick (more only when the tick itself is late). Over any window a
//! bucket admits at most `rate × (window + lag) + burst`, and in the long run exactly the
//! rate: time is never lost, only observed late. Two conditions keep it exact:
//! - the bucket must hold a step's worth of units, or the refill of a step would overflow
//!   it: limits with a tolerance below [`crate::gcra::TICK_CLOCK_MIN_TOLERANCE`] read the
//!   precise clock instead;
//! - CPUs' readings may differ by up to a step: [`crate::gcra::CLOCK_SKEW_MARGIN`] covers it,
//!   so a CPU with an older reading refuses instead of handing out credit.

/// Per-CPU cached clock state (`CLOCK[0]` of each CPU). Zero = never read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickClock {
    /// jiffies when `ns` was read.
    pub jiffies: u64,
    /// CLOCK_MONOTONIC ns read at the first frame of that jiffy on this CPU.
    pub ns: u64,
}

impl TickClock {
    /// The cached reading, refreshed with `read_ns` when jiffies has moved since. A zeroed
    /// entry refreshes on first use too: jiffies is never 0 (it starts at
    /// INITIAL_JIFFIES, 2^32 − 300 s of ticks, and a 64-bit count never wraps).
    #[inline(always)]
    pub fn now(&mut self, jiffies: u64, read_ns: impl FnOnce() -> u64) -> u64 {
        if self.jiffies != jiffies {
            self.ns = read_ns();
            self.jiffies = jiffies;
        }
        self.ns
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::gcra::{conform, ticks_from_ns, Granularity, Limit};

    /// A machine's clocks: true time in ns and jiffies of `tick_ns` each.
    struct Machine {
        ns: u64,
        tick_ns: u64,
    }

    impl Machine {
        /// As the kernel counts them: from INITIAL_JIFFIES (2^32 − 300 s of ticks), never 0.
        fn jiffies(&self) -> u64 {
            let initial = (1u64 << 32) - 300 * (1_000_000_000 / self.tick_ns);
            initial + self.ns / self.tick_ns
        }
    }

    #[test]
    fn reads_the_precise_clock_once_per_jiffy() {
        let mut c = TickClock::default();
        let mut reads = 0;
        let mut m = Machine {
            ns: 1_000_000_000,
            tick_ns: 4_000_000,
        };
        let mut seen = Vec::new();
        for _ in 0..1000 {
            m.ns += 40_000; // 25k frames/s: 100 frames per tick
            let now = c.now(m.jiffies(), || {
                reads += 1;
                m.ns
            });
            assert!(now <= m.ns && m.ns - now < m.tick_ns, "lag {}", m.ns - now);
            seen.push(now);
        }
        assert_eq!(reads, 11, "one read per jiffy crossed");
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "monotonic");
    }

    /// Runs `frames` frames of one unit, `gap_ns` apart, through a bucket whose clock is a
    /// TickClock on a machine with `tick_ns` jiffies. Returns (admitted, elapsed ns).
    fn run(limit: Limit, tick_ns: u64, gap_ns: u64, frames: u64, start_ns: u64) -> (u64, u64) {
        let mut m = Machine {
            ns: start_ns,
            tick_ns,
        };
        let mut clock = TickClock::default();
        let mut tat = 0;
        let mut admitted = 0;
        for _ in 0..frames {
            m.ns += gap_ns;
            let now_ns = m.ns;
            let now = ticks_from_ns(clock.now(m.jiffies(), || now_ns));
            let step = conform(tat, now, limit.cost(1), limit.tolerance);
            tat = step.tat;
            admitted += u64::from(step.admit);
        }
        (admitted, frames * gap_ns)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Overloaded, a bucket on the tick clock admits the rate to within a tick's worth
        /// plus the burst, at HZ 100..1000, whenever it qualifies for the tick clock.
        #[test]
        fn tick_clock_keeps_the_rate(
            rate in 100u64..2_000_000,
            burst_ms in 34u64..400,
            hz in prop::sample::select(vec![100u64, 250, 300, 1000]),
            overload_percent in 110u64..1000,
            start_ns in 1u64..1 << 50,
        ) {
            let burst = (rate * burst_ms / 1000).max(1);
            let limit = Limit::new(Granularity::Event, rate, burst).unwrap();
            prop_assume!(limit.tick_clock_ok());
            let tick_ns = 1_000_000_000 / hz;
            let gap_ns = (1_000_000_000 * 100 / (rate * overload_percent)).max(1);
            let frames = (rate * 2).min(400_000);
            let (admitted, elapsed) = run(limit, tick_ns, gap_ns, frames, start_ns);
            let offered = frames;
            let exact = (u128::from(rate) * u128::from(elapsed) / 1_000_000_000) as u64;
            // Never more than rate × (elapsed + one tick) + burst ...
            let ceiling = u128::from(rate) * u128::from(elapsed + tick_ns) / 1_000_000_000
                + u128::from(burst);
            prop_assert!(u128::from(admitted) <= ceiling, "admitted {admitted} > {ceiling}");
            // ... and never less than the rate over the elapsed time minus one tick.
            let floor = (u128::from(rate) * u128::from(elapsed.saturating_sub(tick_ns))
                / 1_000_000_000) as u64;
            prop_assert!(
                admitted >= floor.min(offered),
                "admitted {admitted} < {floor} (exact {exact}) at HZ {hz}"
            );
        }

        /// Offered below the rate, nothing is dropped on the tick clock either.
        #[test]
        fn tick_clock_drops_nothing_under_the_rate(
            rate in 100u64..2_000_000,
            burst_ms in 34u64..400,
            hz in prop::sample::select(vec![100u64, 250, 300, 1000]),
            slack_percent in 1u64..90,
            start_ns in 1u64..1 << 50,
        ) {
            let burst = (rate * burst_ms / 1000).max(1);
            let limit = Limit::new(Granularity::Event, rate, burst).unwrap();
            prop_assume!(limit.tick_clock_ok());
            let gap_ns = 1_000_000_000 * 100 / (rate * (100 - slack_percent)) + 1;
            let frames = (rate * 2).min(400_000);
            let (admitted, _) = run(limit, 1_000_000_000 / hz, gap_ns, frames, start_ns);
            prop_assert_eq!(admitted, frames);
        }
    }
}
