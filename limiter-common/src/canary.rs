//! A canary: a rule that enforces for a fixed fraction of its sources (`enforce_percent`)
//! and counts the rest of its refusals as would-drops, the rollout step between shadow
//! mode and full enforcement.
//!
//! Which sources are in is decided by a keyed hash of the source, so each client sees
//! one behaviour, frame after frame, across reloads and restarts:
//! - the source is the address masked to the rule's source prefix (`source_prefix_v4`,
//!   `source_prefix_v6`: the per-source limit's `prefix_v4`/`prefix_v6`, full addresses
//!   without one), so a rule that meters /24s puts a whole /24 in or out;
//! - the key is the per-source sketch's secret seed (`SKETCH_META`): random, written once
//!   by the daemon and kept with the pinned maps, so membership survives restarts, and an
//!   outsider cannot compute offline which addresses are in or out. The hash is
//!   separated from the sketch's cell hash by a domain word and the seed's order;
//! - the rule is not hashed: at one percentage a source is in every rule's canary or in
//!   none (for the same source prefix), and a source in at `p` is in at every `p' > p`
//!   (a point below a threshold stays below a larger one), so widening a canary only adds
//!   sources, never flips one back.
//!
//! A source's *point* is 32 bits of the hash; a percentage is a threshold in 0..=2^32,
//! and the source is enforced when its point is below it.

use crate::{
    abi::{masked_source, AddrWords, RuleConfig, RULE_CANARY},
    sketch::{finalise, mix},
};

/// `enforce_percent` is held in thousandths of a percent: 100 % is this.
pub const ALL: u32 = 100_000;

/// Separates the canary's hash from the sketch's (ASCII "canary").
const DOMAIN: u64 = 0x0000_6361_6e61_7279;

/// A source's canary point: the keyed hash of its masked address (words, network order,
/// as [`masked_source`] gives them), 32 bits.
#[inline(always)]
pub fn point(seed: &[u64; 2], family: u32, masked: &AddrWords) -> u32 {
    let mut h = seed[1];
    h = mix(h, DOMAIN);
    h = mix(h, u64::from(family));
    h = mix(h, (u64::from(masked[0]) << 32) | u64::from(masked[1]));
    h = mix(h, (u64::from(masked[2]) << 32) | u64::from(masked[3]));
    h = mix(h, seed[0]);
    (finalise(h) >> 32) as u32
}

/// The threshold of a percentage given in thousandths (`milli_percent` ≤ [`ALL`]; more
/// reads as [`ALL`]): the number of points below it is the percentage of 2^32, rounded.
/// Monotone: a larger percentage never has a smaller threshold.
pub const fn threshold(milli_percent: u32) -> u64 {
    let m = if milli_percent > ALL {
        ALL
    } else {
        milli_percent
    } as u64;
    ((m << 32) + (ALL as u64 / 2)) / ALL as u64
}

/// The percentage (in thousandths) a threshold was made from: the inverse of
/// [`threshold`] (a step of 0.001 % is about 42,950 points, so rounding finds it), for
/// readers of a rule's entry (`limiter stats`, metrics).
pub const fn milli_percent(threshold: u64) -> u32 {
    let t = if threshold > 1 << 32 {
        1 << 32
    } else {
        threshold
    };
    ((t * ALL as u64 + (1 << 31)) >> 32) as u32
}

/// Whether a source with canary point `point` is enforced at `threshold`.
#[inline(always)]
pub const fn in_canary(point: u32, threshold: u64) -> bool {
    (point as u64) < threshold
}

/// Whether `rule` enforces for the source `src` (words, network order, unmasked) of
/// `family`: always, unless the rule is a canary ([`RULE_CANARY`]) and the source is
/// outside it. Shadow mode is not read here. The one definition: the XDP program calls it
/// where it refuses a frame, `limiter explain` to say what a source sees.
#[inline(always)]
pub fn enforced(rule: &RuleConfig, seed: &[u64; 2], family: u32, src: &AddrWords) -> bool {
    if rule.flags & RULE_CANARY == 0 {
        return true;
    }
    let masked = masked_source(family, src, rule.source_prefix_v4, rule.source_prefix_v6);
    in_canary(point(seed, family, &masked), rule.canary_threshold)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::abi::{addr_words, RULE_IN_USE};

    fn v4(a: u32) -> AddrWords {
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&a.to_be_bytes());
        addr_words(&src)
    }

    fn canary_rule(milli_percent: u32, prefix_v4: u32) -> RuleConfig {
        RuleConfig {
            flags: RULE_IN_USE | RULE_CANARY,
            canary_threshold: threshold(milli_percent),
            source_prefix_v4: prefix_v4,
            ..RuleConfig::EMPTY
        }
    }

    /// How many of `n` distinct IPv4 sources (from `base`) the rule enforces for.
    fn enforced_count(rule: &RuleConfig, seed: &[u64; 2], base: u32, n: u32) -> u32 {
        (0..n)
            .filter(|&i| enforced(rule, seed, 4, &v4(base.wrapping_add(i))))
            .count() as u32
    }

    /// `count` of `n` is within `sigmas` binomial standard deviations of `p`.
    fn assert_binomial(count: u32, n: u32, p: f64, sigmas: f64, what: &str) {
        let expected = f64::from(n) * p;
        let sd = (f64::from(n) * p * (1.0 - p)).sqrt();
        let off = (f64::from(count) - expected).abs();
        assert!(
            off <= sigmas * sd + 1.0,
            "{what}: {count} of {n} enforced, expected {expected:.1} ± {:.1} ({sigmas} σ)",
            sigmas * sd
        );
    }

    #[test]
    fn thresholds_cover_the_ends_and_round() {
        assert_eq!(threshold(0), 0);
        assert_eq!(threshold(ALL), 1 << 32);
        assert_eq!(threshold(ALL + 1), 1 << 32);
        assert_eq!(threshold(50_000), 1 << 31);
        // 2.5 %: 2^32 × 0.025 = 107,374,182.4.
        assert_eq!(threshold(2_500), 107_374_182);
        // The smallest step, 0.001 %, is a nonzero threshold.
        assert!(threshold(1) > 0);
    }

    #[test]
    fn every_percentage_is_read_back_from_its_threshold() {
        for m in 0..=ALL {
            assert_eq!(milli_percent(threshold(m)), m);
        }
        assert_eq!(milli_percent(u64::MAX), ALL);
    }

    #[test]
    fn zero_enforces_none_and_all_enforces_every_source() {
        let seed = [0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321];
        assert_eq!(
            enforced_count(&canary_rule(0, 32), &seed, 0xC612_0000, 10_000),
            0
        );
        assert_eq!(
            enforced_count(&canary_rule(ALL, 32), &seed, 0xC612_0000, 10_000),
            10_000
        );
        // The extreme points themselves.
        assert!(!in_canary(0, threshold(0)));
        assert!(in_canary(u32::MAX, threshold(ALL)));
    }

    #[test]
    fn a_rule_without_the_canary_flag_enforces_for_everyone() {
        let rule = RuleConfig {
            flags: RULE_IN_USE,
            canary_threshold: 0,
            ..RuleConfig::EMPTY
        };
        assert_eq!(enforced_count(&rule, &[1, 2], 0xC612_0000, 1000), 1000);
    }

    #[test]
    fn the_enforced_fraction_is_the_percentage_within_the_binomial_bound() {
        let seeds = [
            [0, 0],
            [1, 2],
            [0x9E37_79B9_7F4A_7C15, 0xD1B5_4A32_D192_ED03],
            [u64::MAX, 0x5555_5555_5555_5555],
        ];
        for seed in seeds {
            for milli in [1_000, 2_500, 5_000, 25_000, 50_000, 90_000] {
                let n = 10_000;
                let count = enforced_count(&canary_rule(milli, 32), &seed, 0xC612_0000, n);
                let p = f64::from(milli) / f64::from(ALL);
                assert_binomial(count, n, p, 4.0, &format!("seed {seed:x?}, {milli} m%"));
            }
        }
    }

    #[test]
    fn a_prefix_is_in_or_out_as_a_whole() {
        let seed = [7, 11];
        let rule = canary_rule(50_000, 24);
        for net in 0..200u32 {
            let base = 0xC612_0000 | (net << 8);
            let first = enforced(&rule, &seed, 4, &v4(base));
            for host in 1..=255 {
                assert_eq!(enforced(&rule, &seed, 4, &v4(base | host)), first);
            }
        }
        // And /24s are split about evenly, not all in or all out.
        let nets = (0..2000u32)
            .filter(|net| enforced(&rule, &seed, 4, &v4(0xC612_0000 | (net << 8) | 9)))
            .count() as u32;
        assert_binomial(nets, 2000, 0.5, 4.0, "/24s at 50 %");
    }

    #[test]
    fn the_seed_decides_which_sources_are_in() {
        let rule = canary_rule(50_000, 32);
        let (a, b) = ([1, 2], [3, 4]);
        let same = (0..10_000u32)
            .filter(|&i| {
                let src = v4(0xC612_0000 + i);
                enforced(&rule, &a, 4, &src) == enforced(&rule, &b, 4, &src)
            })
            .count() as u32;
        // Independent at 50 %: they agree on about half.
        assert_binomial(same, 10_000, 0.5, 4.0, "agreement of two seeds");
    }

    #[test]
    fn ipv6_sources_are_masked_by_the_v6_prefix() {
        let seed = [5, 6];
        let rule = RuleConfig {
            source_prefix_v6: 64,
            ..canary_rule(50_000, 32)
        };
        let addr = |net: u16, host: u16| {
            let mut a = [0u8; 16];
            a[..2].copy_from_slice(&0x2001u16.to_be_bytes());
            a[2..4].copy_from_slice(&0x0db8u16.to_be_bytes());
            a[6..8].copy_from_slice(&net.to_be_bytes());
            a[14..].copy_from_slice(&host.to_be_bytes());
            addr_words(&a)
        };
        let mut ins = 0;
        for net in 0..2000u16 {
            let first = enforced(&rule, &seed, 6, &addr(net, 1));
            for host in [2, 0xffff] {
                assert_eq!(enforced(&rule, &seed, 6, &addr(net, host)), first);
            }
            ins += u32::from(first);
        }
        assert_binomial(ins, 2000, 0.5, 4.0, "IPv6 /64s at 50 %");
    }

    proptest! {
        /// Raising the percentage only adds sources: one in at `p` is in at any `p' ≥ p`.
        #[test]
        fn widening_a_canary_only_adds_sources(
            seed in any::<[u64; 2]>(),
            addr in any::<u32>(),
            p in 0..=ALL,
            q in 0..=ALL,
        ) {
            let (lo, hi) = if p <= q { (p, q) } else { (q, p) };
            let src = v4(addr);
            if enforced(&canary_rule(lo, 32), &seed, 4, &src) {
                prop_assert!(enforced(&canary_rule(hi, 32), &seed, 4, &src));
            }
            prop_assert!(threshold(lo) <= threshold(hi));
        }

        /// The fraction holds for any seed and any block of sources: 5 σ here (random
        /// seeds at every run, 256 cases: 4 σ would fail about one run in sixty).
        #[test]
        fn the_fraction_holds_for_any_seed(
            seed in any::<[u64; 2]>(),
            base in any::<u32>(),
            milli in 500..=99_500u32,
        ) {
            let n = 10_000;
            let count = enforced_count(&canary_rule(milli, 32), &seed, base, n);
            let p = f64::from(milli) / f64::from(ALL);
            let sd = (f64::from(n) * p * (1.0 - p)).sqrt();
            prop_assert!((f64::from(count) - f64::from(n) * p).abs() <= 5.0 * sd + 1.0,
                "{} of {} at {} m%", count, n, milli);
        }

        /// The hash keys on the masked source only: host bits below the prefix never
        /// move a source in or out.
        #[test]
        fn host_bits_below_the_prefix_do_not_matter(
            seed in any::<[u64; 2]>(),
            addr in any::<u32>(),
            other in any::<u32>(),
            prefix in 0..=32u32,
            milli in 0..=ALL,
        ) {
            let host_mask = if prefix == 32 { 0 } else { u32::MAX >> prefix };
            let sibling = (addr & !host_mask) | (other & host_mask);
            let rule = canary_rule(milli, prefix);
            prop_assert_eq!(
                enforced(&rule, &seed, 4, &v4(addr)),
                enforced(&rule, &seed, 4, &v4(sibling))
            );
        }
    }
}
