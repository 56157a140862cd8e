//! Which part of the per-source sketch each rule meters its sources in
//! (limiter_common::sketch::region), chosen at every install. Pure: the daemon's maps code
//! applies the plan (writes the regions into the rules, clears the fresh ones).
//!
//! Every row is cut into 2^k equal parts for the n per-source rules (k = ⌈log2 n⌉), so
//! rules never share a cell: a flood on one rule cannot exhaust the cells of another
//! rule's sources. A rule keeps its part across installs while the cut, its name and its
//! per-source limit stay the same (its sources keep their state); a part that changes
//! hands, or whose rule's limit changed, is cleared first, so no earlier owner's state
//! limits the new one's sources. A cleared part gives its sources their burst once, as a
//! new rule would.

use std::collections::{BTreeMap, BTreeSet};

use limiter_common::{
    gcra::Limit,
    sketch::{region, region_index, region_parts_log2, WHOLE_ROW},
};

/// A per-source rule as the plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceRule<'a> {
    pub name: &'a [u8],
    pub limit: Limit,
    /// Its region (live rules; ignored for the next table's).
    pub region: u32,
}

/// The regions of the next table's per-source rules, by slot, and which of them must be
/// cleared before the table goes live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionPlan {
    pub regions: BTreeMap<u32, u32>,
    pub cleared: Vec<u32>,
}

/// ⌈log2 n⌉, 0 for n ≤ 1.
fn parts_log2_for(n: usize) -> u32 {
    n.max(1).next_power_of_two().trailing_zeros()
}

/// Whether two regions share a cell (for any row width they both fit in).
pub fn overlaps(a: u32, b: u32) -> bool {
    let (la, lb) = (region_parts_log2(a), region_parts_log2(b));
    let common = la.min(lb);
    let index = |r: u32, l: u32| region_index(r) & ((1u32 << l) - 1);
    (index(a, la) >> (la - common)) == (index(b, lb) >> (lb - common))
}

/// Plans the regions for `next` (slot → per-source rule of the table about to go live)
/// given `live` (slot → per-source rule of the live table, with its region).
pub fn plan(live: &BTreeMap<u32, SourceRule>, next: &BTreeMap<u32, SourceRule>) -> RegionPlan {
    let log2 = parts_log2_for(next.len());
    let region_of = |index: u32| {
        if log2 == 0 {
            WHOLE_ROW
        } else {
            region(log2, index)
        }
    };
    let mut plan = RegionPlan::default();
    let mut taken = BTreeSet::new();
    // A rule keeps its part when it is the same rule (name and limit), the cut is the
    // same, and no other live rule used any of its cells (a version before regions put
    // every rule in the whole row).
    for (slot, rule) in next {
        let Some(before) = live.get(slot) else {
            continue;
        };
        let same_rule = before.name == rule.name && before.limit == rule.limit;
        let same_cut = region_parts_log2(before.region) == log2;
        let index = region_index(before.region);
        let alone = live
            .iter()
            .all(|(other, r)| other == slot || !overlaps(r.region, before.region));
        if same_rule
            && same_cut
            && alone
            && region_of(index) == before.region
            && taken.insert(index)
        {
            plan.regions.insert(*slot, before.region);
        }
    }
    let mut free = (0u32..).filter(|i| !taken.contains(i));
    for slot in next.keys() {
        if plan.regions.contains_key(slot) {
            continue;
        }
        let Some(index) = free.next() else {
            break;
        };
        let r = region_of(index);
        plan.regions.insert(*slot, r);
        plan.cleared.push(r);
    }
    plan
}

#[cfg(test)]
mod tests {
    use limiter_common::sketch::region_span;
    use proptest::prelude::*;

    use super::*;

    const A: Limit = Limit {
        interval: 1000,
        tolerance: 5000,
    };
    const B: Limit = Limit {
        interval: 10,
        tolerance: 990,
    };

    fn rules<'a>(list: &[(u32, &'a str, Limit, u32)]) -> BTreeMap<u32, SourceRule<'a>> {
        list.iter()
            .map(|&(slot, name, limit, region)| {
                (
                    slot,
                    SourceRule {
                        name: name.as_bytes(),
                        limit,
                        region,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn one_rule_has_the_whole_row_and_keeps_it() {
        let first = plan(&BTreeMap::new(), &rules(&[(3, "a", A, 0)]));
        assert_eq!(first.regions[&3], WHOLE_ROW);
        assert_eq!(
            first.cleared,
            vec![WHOLE_ROW],
            "a new rule starts on clear cells"
        );
        let again = plan(&rules(&[(3, "a", A, WHOLE_ROW)]), &rules(&[(3, "a", A, 0)]));
        assert_eq!(again.regions[&3], WHOLE_ROW);
        assert!(
            again.cleared.is_empty(),
            "an unchanged rule keeps its state"
        );
    }

    #[test]
    fn rules_get_disjoint_parts_and_keep_them_while_the_cut_holds() {
        let next = rules(&[(0, "a", A, 0), (1, "b", B, 0), (5, "c", A, 0)]);
        let first = plan(&BTreeMap::new(), &next);
        let live: BTreeMap<u32, SourceRule> = next
            .iter()
            .map(|(s, r)| {
                (
                    *s,
                    SourceRule {
                        region: first.regions[s],
                        ..*r
                    },
                )
            })
            .collect();
        // A fourth rule: same cut (4 parts), the three keep theirs.
        let mut more = next.clone();
        more.insert(
            7,
            SourceRule {
                name: b"d",
                limit: B,
                region: 0,
            },
        );
        let second = plan(&live, &more);
        for slot in [0, 1, 5] {
            assert_eq!(second.regions[&slot], first.regions[&slot]);
        }
        assert_eq!(second.cleared, vec![second.regions[&7]]);
        // A fifth: the cut changes, every part is new and cleared.
        let mut live2 = live.clone();
        live2.insert(
            7,
            SourceRule {
                region: second.regions[&7],
                ..more[&7]
            },
        );
        let mut five = more.clone();
        five.insert(
            9,
            SourceRule {
                name: b"e",
                limit: A,
                region: 0,
            },
        );
        let third = plan(&live2, &five);
        assert_eq!(third.cleared.len(), 5);
    }

    #[test]
    fn a_changed_limit_or_a_new_owner_clears_the_part() {
        let live = rules(&[(0, "a", A, region(1, 0)), (1, "b", B, region(1, 1))]);
        let changed = plan(&live, &rules(&[(0, "a", B, 0), (1, "z", B, 0)]));
        assert_eq!(changed.cleared.len(), 2, "{changed:?}");
    }

    #[test]
    fn rules_of_a_version_before_regions_are_moved_off_the_shared_row() {
        // Both in the whole row: their cells are mixed, so neither keeps them.
        let live = rules(&[(0, "a", A, WHOLE_ROW), (1, "b", B, WHOLE_ROW)]);
        let alone = plan(&live, &rules(&[(0, "a", A, 0)]));
        assert_eq!(alone.cleared, vec![WHOLE_ROW]);
    }

    proptest! {
        /// Whatever the live table, the planned parts never share a cell, every
        /// per-source rule gets one, and a part that is not cleared belonged to that
        /// same rule alone.
        #[test]
        fn planned_parts_are_disjoint_and_kept_parts_were_the_rules_own(
            live_rules in proptest::collection::btree_map(0u32..64, (0u8..4, 0u32..4, 0u32..8), 0..12),
            next_rules in proptest::collection::btree_map(0u32..64, 0u8..4, 0..12),
        ) {
            let names = ["a", "b", "c", "d"];
            let limits = [A, B];
            let live: BTreeMap<u32, SourceRule> = live_rules
                .iter()
                .map(|(&s, &(n, l2, i))| (s, SourceRule {
                    name: names[n as usize].as_bytes(),
                    limit: limits[(n % 2) as usize],
                    region: if l2 == 0 { WHOLE_ROW } else { region(l2, i % (1 << l2)) },
                }))
                .collect();
            let next: BTreeMap<u32, SourceRule> = next_rules
                .iter()
                .map(|(&s, &n)| (s, SourceRule {
                    name: names[n as usize].as_bytes(),
                    limit: limits[(n % 2) as usize],
                    region: 0,
                }))
                .collect();
            let p = plan(&live, &next);
            prop_assert_eq!(p.regions.len(), next.len());
            let mask = (1u32 << 12) - 1;
            let spans: Vec<(u32, u32)> = p.regions.values().map(|&r| region_span(r, mask)).collect();
            for (i, a) in spans.iter().enumerate() {
                for b in &spans[i + 1..] {
                    let disjoint = a.0 + a.1 < b.0 || b.0 + b.1 < a.0;
                    prop_assert!(disjoint, "{:?} and {:?} share cells", a, b);
                }
            }
            for (slot, r) in &p.regions {
                if p.cleared.contains(r) {
                    continue;
                }
                let before = live.get(slot).expect("a kept part was live");
                prop_assert_eq!(before.region, *r);
                prop_assert_eq!(before.name, next[slot].name);
                for (other, o) in &live {
                    if other != slot {
                        prop_assert!(!overlaps(o.region, *r));
                    }
                }
            }
        }
    }
}
