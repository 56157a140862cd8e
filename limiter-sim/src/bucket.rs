//! One rule's aggregate bucket on one host, and the traffic offered to it.
//!
//! The bucket is the kernel's: a TAT in ticks, advanced by limiter-common's [`conform`]
//! with a [`Limit`] compiled by [`Limit::new`]. Arrivals are either a Poisson process
//! offered packet by packet (exact GCRA, used for the low per-host rates where a burst of
//! one or a few tokens makes every packet count) or, above a threshold rate, a dense
//! stream whose admitted count per interval comes from a closed form (see
//! [`Bucket::offer_even`]).

use anyhow::{Context as _, Result};
use limiter_common::gcra::{conform, tat_with_tokens, ticks_from_ns, Granularity, Limit};

use crate::{rng::Rng, time::NS_PER_S};

/// Virtual time 0 is not a valid kernel clock reading for a bucket (a TAT of 0 means
/// "never used"), so buckets see the simulation clock shifted by a minute of uptime.
const CLOCK_EPOCH_NS: u64 = 60 * NS_PER_S;

fn ticks(ns: u64) -> u64 {
    ticks_from_ns(ns + CLOCK_EPOCH_NS)
}

/// Frames offered and admitted over some period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub offered: u64,
    pub admitted: u64,
}

impl Counts {
    pub fn dropped(&self) -> u64 {
        self.offered - self.admitted
    }

    pub fn add(&mut self, other: Counts) {
        self.offered += other.offered;
        self.admitted += other.admitted;
    }
}

/// A GCRA bucket exactly as the kernel keeps it.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub limit: Limit,
    /// Theoretical arrival time in ticks; 0 = never used (full).
    pub tat: u64,
    /// A grant's credit (`Grant::credit`) as a bank beside the bucket: frames it may
    /// still admit that the bucket refuses (spent one per refused frame, never
    /// overflowing; replaced by the next grant's). What the kernel would need: one
    /// counter per rule, decremented on a refusal while positive.
    pub credit: u64,
    /// Frames admitted on credit so far (a running count).
    pub credited: u64,
}

/// A share of 0 is closed ([`Limit::CLOSED`]): the kernel refuses everything on a zero
/// grant until the lease lapses (`RULE_CLOSED_UNTIL_LAPSE`). After the lapse the kernel
/// meters the bootstrap share on its own; the simulator models the daemon's rejoin on
/// refusals instead (its 50 ms poll), which is at most one poll later.
fn compile(rate: u64, burst: u64) -> Result<Limit> {
    if rate == 0 {
        return Ok(Limit::CLOSED);
    }
    Limit::new(Granularity::Event, rate, burst)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("compiling a limit of {rate}/s with burst {burst}"))
}

impl Bucket {
    /// A fresh bucket (full: `burst` tokens).
    pub fn new(rate: u64, burst: u64) -> Result<Bucket> {
        Ok(Bucket {
            limit: compile(rate, burst)?,
            tat: 0,
            credit: 0,
            credited: 0,
        })
    }

    /// A new rate and burst; the TAT stays (what the daemon does on a renewal).
    pub fn set_limit(&mut self, rate: u64, burst: u64) -> Result<()> {
        self.limit = compile(rate, burst)?;
        Ok(())
    }

    /// Leaves exactly `tokens` available at `now_ns` (a first grant's token count).
    pub fn set_tokens(&mut self, now_ns: u64, tokens: u64) {
        self.tat = tat_with_tokens(&self.limit, ticks(now_ns), tokens);
    }

    /// Adds up to `tokens` to the bucket at `now_ns`, never beyond its burst: a credit
    /// applied to the TAT (moved back by `tokens` emission intervals, at most to full),
    /// which the kernel's bucket can hold today. Returns the tokens added.
    pub fn add_tokens(&mut self, now_ns: u64, tokens: u64) -> u64 {
        if self.limit.is_closed() || tokens == 0 {
            return 0;
        }
        let now = ticks(now_ns);
        if self.tat == 0 || self.tat <= now {
            return 0; // full
        }
        let cost = self.limit.cost(1).max(1);
        let room = (self.tat - now) / cost;
        let add = tokens.min(room);
        self.tat -= add * cost;
        add
    }

    /// Tokens available at `now_ns` (whole units, rounded down).
    pub fn tokens(&self, now_ns: u64) -> u64 {
        let now = ticks(now_ns);
        let used = if self.tat == 0 {
            0
        } else {
            self.tat.saturating_sub(now)
        };
        let cost = self.limit.cost(1).max(1);
        self.limit.tolerance.saturating_sub(used) / cost
    }

    /// One packet at `now_ns`: the kernel's per-packet step.
    pub fn offer(&mut self, now_ns: u64) -> bool {
        let step = conform(
            self.tat,
            ticks(now_ns),
            self.limit.cost(1),
            self.limit.tolerance,
        );
        self.tat = step.tat;
        if !step.admit && self.credit > 0 && !self.limit.is_closed() {
            self.credit -= 1;
            self.credited += 1;
            return true;
        }
        step.admit
    }

    /// `n` packets evenly spaced over `[start_ns, end_ns)`, in closed form: the count
    /// sequential GCRA admits when arrivals are dense compared with the limit's interval.
    ///
    /// The first conforming packet starts from `max(tat, first arrival)`; from there at
    /// most one packet per interval (plus what the tolerance holds) can conform up to the
    /// last arrival, so `k = min(n, (last + tolerance - base) / interval)`. The TAT ends at
    /// `base + k * interval` (or one interval after the last arrival when every packet
    /// passed, as sequential GCRA leaves it), never beyond `last + tolerance`, so the
    /// bound "admitted ≤ rate × time + burst" holds exactly as in the kernel. A TAT
    /// beyond the tolerance (a lowered limit) is pulled back as [`conform`] does.
    pub fn offer_even(&mut self, start_ns: u64, end_ns: u64, n: u64) -> u64 {
        if n == 0 || end_ns <= start_ns || self.limit.is_closed() {
            // Closed: nothing conforms and the TAT stays (as `conform` leaves it).
            return 0;
        }
        let gap = (end_ns - start_ns) / n;
        let first = ticks(start_ns + gap / 2);
        let last = first + ticks_from_ns(gap * (n - 1));
        let cost = self.limit.cost(1);
        let tol = self.limit.tolerance;
        let mut tat = self.tat;
        if tat != 0 && tat > first + tol {
            tat = first + tol;
        }
        let base = if tat == 0 || tat <= first { first } else { tat };
        let k = ((last + tol).saturating_sub(base) / cost).min(n);
        self.tat = if k == 0 {
            tat
        } else if k == n {
            (base + k * cost).max(last + cost)
        } else {
            base + k * cost
        };
        let spent = self.credit.min(n - k);
        self.credit -= spent;
        self.credited += spent;
        k + spent
    }
}

/// What happens to the frames a host receives for a rule.
pub enum Verdict<'a> {
    /// FAIL_OPEN: everything passes.
    Open,
    /// Metered by the rule's bucket.
    Meter(&'a mut Bucket),
}

/// The traffic one host receives for one rule.
#[derive(Clone, Debug)]
pub struct Arrivals {
    /// Offered frames per second.
    pub rate: f64,
    /// Above this per-host rate, arrivals are dense (closed form); at or below, Poisson.
    pub dense_above: f64,
    /// Next Poisson arrival (ns); `u64::MAX` when idle or dense.
    next: u64,
    /// Fractional dense arrivals carried to the next interval.
    carry: f64,
    rng: Rng,
}

impl Arrivals {
    pub fn new(rng: Rng, dense_above: f64) -> Arrivals {
        Arrivals {
            rate: 0.0,
            dense_above,
            next: u64::MAX,
            carry: 0.0,
            rng,
        }
    }

    pub fn dense(&self) -> bool {
        self.rate > self.dense_above
    }

    /// The offered rate changes at `now` (Poisson arrivals are memoryless, so the next
    /// one is drawn afresh).
    pub fn set_rate(&mut self, rate: f64, now: u64) {
        self.rate = rate.max(0.0);
        self.carry = 0.0;
        self.next = if self.rate > 0.0 && !self.dense() {
            now + self.rng.exp_gap_ns(self.rate)
        } else {
            u64::MAX
        };
    }

    /// When the next frame arrives (`now` for a dense stream, `None` when idle).
    pub fn first_arrival(&self, now: u64) -> Option<u64> {
        if self.rate <= 0.0 {
            None
        } else if self.dense() {
            Some(now)
        } else {
            Some(self.next)
        }
    }

    /// Offers the frames arriving in `[start, end)`.
    pub fn run(&mut self, start: u64, end: u64, mut verdict: Verdict<'_>) -> Counts {
        let mut c = Counts::default();
        if end <= start || self.rate <= 0.0 {
            return c;
        }
        if self.dense() {
            let expected = self.carry + self.rate * (end - start) as f64 / NS_PER_S as f64;
            let n = expected.floor();
            self.carry = expected - n;
            c.offered = n as u64;
            c.admitted = match verdict {
                Verdict::Open => c.offered,
                Verdict::Meter(b) => b.offer_even(start, end, c.offered),
            };
            return c;
        }
        while self.next < end {
            c.offered += 1;
            let admit = match &mut verdict {
                Verdict::Open => true,
                Verdict::Meter(b) => b.offer(self.next.max(start)),
            };
            c.admitted += u64::from(admit);
            self.next += self.rng.exp_gap_ns(self.rate);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Admitted by per-packet GCRA on `n` evenly spaced arrivals per `step`, vs the
    /// closed form over the same steps.
    fn per_packet_vs_closed_form(rate: u64, burst: u64, offered: u64, step: u64, secs: u64) {
        let mut exact = Bucket::new(rate, burst).unwrap();
        let mut closed = exact.clone();
        let n_per_step = offered * step / NS_PER_S;
        let (mut a_exact, mut a_closed) = (0u64, 0u64);
        let mut t = 0;
        while t < secs * NS_PER_S {
            let gap = step / n_per_step;
            for i in 0..n_per_step {
                a_exact += u64::from(exact.offer(t + gap / 2 + i * gap));
            }
            a_closed += closed.offer_even(t, t + step, n_per_step);
            t += step;
        }
        let expected = (rate * secs + burst).min(offered * secs);
        let tol = (expected / 100).max(2);
        assert!(
            a_exact.abs_diff(a_closed) <= tol,
            "rate {rate} burst {burst} offered {offered}: exact {a_exact} closed {a_closed}"
        );
        assert!(a_closed <= rate * secs + burst, "closed form over-admits");
    }

    #[test]
    fn closed_form_matches_per_packet_gcra() {
        for &(rate, burst, offered) in &[
            (4000, 400, 8000),
            (4000, 400, 3000),
            (20, 1, 5000),
            (250, 50, 2000),
            (3000, 1, 2000),
            (100_000, 10_000, 400_000),
        ] {
            for step in [10 * MS, 100 * MS] {
                per_packet_vs_closed_form(rate, burst, offered, step, 20);
            }
        }
    }

    #[test]
    fn closed_form_honours_a_lowered_limit() {
        let mut b = Bucket::new(10_000, 10_000).unwrap();
        assert_eq!(b.offer_even(0, 10 * MS, 10_000), 10_000);
        b.set_limit(100, 1).unwrap();
        // The TAT is a second ahead: read as empty, pulled back to one interval.
        let a = b.offer_even(10 * MS, 1010 * MS, 100_000);
        assert!((99..=101).contains(&a), "{a}");
    }

    #[test]
    fn burst_one_under_poisson_admits_r_lambda_over_r_plus_lambda() {
        // After each admission the next is the first arrival one interval later: the mean
        // gap is 1/r + 1/λ. This is what a BOOTSTRAP share (burst 1) really admits.
        for (r, lambda) in [(20u64, 30.0), (20, 200.0), (250, 300.0)] {
            let mut b = Bucket::new(r, 1).unwrap();
            let mut a = Arrivals::new(Rng::new(r), 1e9);
            a.set_rate(lambda, 0);
            let secs = 2000;
            let c = a.run(0, secs * NS_PER_S, Verdict::Meter(&mut b));
            let got = c.admitted as f64 / secs as f64;
            let want = r as f64 * lambda / (r as f64 + lambda);
            assert!(
                (got - want).abs() / want < 0.02,
                "r {r} λ {lambda}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn a_share_of_zero_is_closed_in_both_forms() {
        // A bucket that was full, then closed (a zero grant keeps the TAT).
        let mut b = Bucket::new(250, 50).unwrap();
        b.set_limit(0, 1).unwrap();
        assert!(b.limit.is_closed());
        assert_eq!(b.tokens(NS_PER_S), 0);
        assert!(!b.offer(NS_PER_S));
        assert_eq!(b.offer_even(NS_PER_S, 2 * NS_PER_S, 100_000), 0);
        let mut a = Arrivals::new(Rng::new(3), 1e9);
        a.set_rate(300.0, 2 * NS_PER_S);
        let c = a.run(2 * NS_PER_S, 12 * NS_PER_S, Verdict::Meter(&mut b));
        assert!(c.offered > 2000 && c.admitted == 0, "{c:?}");
        // A grant after it takes over with its token count.
        b.set_limit(250, 50).unwrap();
        b.set_tokens(12 * NS_PER_S, 0);
        assert!(!b.offer(12 * NS_PER_S));
        assert!(b.offer(12 * NS_PER_S + 4 * 1_000_000));
    }

    #[test]
    fn tokens_set_what_a_first_grant_lets_through() {
        let mut b = Bucket::new(250, 50).unwrap();
        b.set_tokens(5 * NS_PER_S, 1);
        assert_eq!(b.tokens(5 * NS_PER_S), 1);
        assert!(b.offer(5 * NS_PER_S));
        assert!(!b.offer(5 * NS_PER_S));
        // A fresh bucket holds the whole burst.
        assert_eq!(Bucket::new(250, 50).unwrap().tokens(0), 50);
    }

    #[test]
    fn open_admits_everything_and_rates_switch_modes() {
        let mut a = Arrivals::new(Rng::new(1), 1000.0);
        a.set_rate(5000.0, 0);
        assert!(a.dense());
        let c = a.run(0, NS_PER_S, Verdict::Open);
        assert_eq!((c.offered, c.admitted), (5000, 5000));
        a.set_rate(100.0, NS_PER_S);
        assert!(!a.dense());
        assert!(a.first_arrival(NS_PER_S).unwrap() > NS_PER_S);
        let c = a.run(NS_PER_S, 101 * NS_PER_S, Verdict::Open);
        assert!((9_500..10_500).contains(&c.offered), "{c:?}");
        a.set_rate(0.0, 0);
        assert_eq!(a.first_arrival(0), None);
    }
}
