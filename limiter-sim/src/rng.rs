//! A small seeded PRNG (SplitMix64) and the one distribution the simulator needs:
//! exponential inter-arrival times, which make packet arrivals a Poisson process.

/// SplitMix64 (Steele, Lea, Flood 2014): one u64 of state, passes BigCrush, and any seed
/// (including 0) is fine. Each (rule, host) pair owns one, so results do not depend on
/// the order in which the simulator visits pairs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for one member of a family (e.g. a rule and host), decorrelated from
    /// its neighbours.
    pub fn derive(seed: u64, a: u64, b: u64) -> Rng {
        let mut r = Rng(seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let x = r.next_u64() ^ b.wrapping_mul(0xd1b5_4a32_d192_ed03);
        Rng(x)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (1.0 - self.unit())
    }

    /// An exponential gap in nanoseconds for events at `rate` per second (at least 1 ns).
    pub fn exp_gap_ns(&mut self, rate: f64) -> u64 {
        let gap = -self.unit().ln() / rate * 1e9;
        (gap as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_gaps_have_the_right_mean() {
        let mut r = Rng::new(7);
        let n = 200_000;
        let total: u64 = (0..n).map(|_| r.exp_gap_ns(250.0)).sum();
        let mean_ms = total as f64 / n as f64 / 1e6;
        assert!((mean_ms - 4.0).abs() < 0.05, "mean gap {mean_ms} ms");
    }

    #[test]
    fn derived_streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4).map(|_| Rng::derive(1, 2, 3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::derive(1, 2, 3).next_u64(),
            Rng::derive(1, 2, 4).next_u64()
        );
        let mut r = Rng::new(0);
        assert!((0..1000).all(|_| {
            let u = r.unit();
            u > 0.0 && u <= 1.0
        }));
    }
}
