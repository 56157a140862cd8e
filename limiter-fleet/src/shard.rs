//! A host's side of sharded allocators: which group of allocators each rule is reported
//! to.
//!
//! Sharded allocators split the rules between groups (each group: replicas electing one
//! leader); a group's leader grants only its rules and, for every other rule a host
//! reports to it, names the group that grants it (`elsewhere` in its reply). The host
//! keeps what it learns in a [`Routing`]:
//! - a rule not yet routed is reported to the first group of the host's list;
//! - a routed rule is reported only to its group;
//! - a group moves a rule only while the rule is routed to it (a late reply of a group
//!   the rule has left changes nothing), and only to a group of the host's own list
//!   (any other name is refused and the rule goes back to the first group).
//!
//! So every rule is reported to exactly one group per round.

use std::collections::BTreeMap;

/// The host's groups, in its configured order, and the rules routed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routing {
    groups: Vec<String>,
    /// rule → index in `groups`; absent: the first group.
    routes: BTreeMap<String, usize>,
}

/// What [`Routing::learn`] did with a group's word about a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Learned {
    /// The rule is reported to this group from now on (it was elsewhere before).
    Moved(usize),
    /// Nothing changed: the rule already goes there, or the group that spoke is not the
    /// rule's (a late reply).
    Unchanged,
    /// The named group is not one of the host's: the rule is reported to the first group.
    Unknown,
}

impl Routing {
    /// `groups` must not be empty (the config checker refuses an empty list).
    pub fn new(groups: Vec<String>) -> Routing {
        Routing {
            groups,
            routes: BTreeMap::new(),
        }
    }

    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// The group `rule` is reported to: its route, or the first group.
    pub fn group_of(&self, rule: &str) -> usize {
        self.routes.get(rule).copied().unwrap_or(0)
    }

    /// Whether `rule` has been routed by a group's word (not just the first by default).
    pub fn is_routed(&self, rule: &str) -> bool {
        self.routes.contains_key(rule)
    }

    /// Group `from` (an index of the list) says `group` grants `rule`.
    pub fn learn(&mut self, from: usize, rule: &str, group: &str) -> Learned {
        if self.group_of(rule) != from {
            return Learned::Unchanged;
        }
        match self.groups.iter().position(|g| g == group) {
            Some(i) if i == from => Learned::Unchanged,
            Some(i) => {
                self.routes.insert(rule.to_string(), i);
                Learned::Moved(i)
            }
            None => {
                self.routes.remove(rule);
                Learned::Unknown
            }
        }
    }

    /// Forgets the routes of rules for which `keep` is false (rules removed by a reload).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.routes.retain(|rule, _| keep(rule));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn routing() -> Routing {
        Routing::new(vec!["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn unrouted_rules_go_to_the_first_group_routed_ones_to_theirs() {
        let mut r = routing();
        assert_eq!(r.group_of("web"), 0);
        assert_eq!(r.learn(0, "web", "b"), Learned::Moved(1));
        assert_eq!(r.group_of("web"), 1);
        assert!(r.is_routed("web"));
        // A late reply of the first group changes nothing: the rule is b's now.
        assert_eq!(r.learn(0, "web", "c"), Learned::Unchanged);
        assert_eq!(r.group_of("web"), 1);
        // b moves it on.
        assert_eq!(r.learn(1, "web", "c"), Learned::Moved(2));
        // A group the host does not list: back to the first group.
        assert_eq!(r.learn(2, "web", "evil"), Learned::Unknown);
        assert_eq!(r.group_of("web"), 0);
        assert!(!r.is_routed("web"));
        assert_eq!(r.learn(0, "web", "a"), Learned::Unchanged);
        r.learn(0, "api", "b");
        r.retain(|rule| rule != "api");
        assert_eq!(r.group_of("api"), 0);
    }

    proptest! {
        /// Whatever the groups say, in whatever order: every rule goes to exactly one
        /// group of the list each round, a routed rule moves only on its own group's
        /// word, and only to a listed group.
        #[test]
        fn every_rule_goes_to_exactly_one_listed_group(
            words in proptest::collection::vec((0usize..3, 0usize..4, 0usize..5), 0..80),
        ) {
            let rules = ["r0", "r1", "r2", "r3"];
            let names = ["a", "b", "c", "x", "y"];
            let mut r = routing();
            for (from, rule, named) in words {
                let rule = rules[rule];
                let before = r.group_of(rule);
                let learned = r.learn(from, rule, names[named]);
                let after = r.group_of(rule);
                if from != before {
                    prop_assert_eq!(after, before, "a group that is not the rule's moved it");
                    prop_assert_eq!(learned, Learned::Unchanged);
                }
                if after != before {
                    prop_assert!(
                        after == 0 || r.groups()[after] == names[named],
                        "moved to a group nobody named"
                    );
                }
                // One round: each rule reported to exactly one group, a listed one.
                for rule in rules {
                    let to: Vec<usize> = (0..r.groups().len())
                        .filter(|&g| r.group_of(rule) == g)
                        .collect();
                    prop_assert_eq!(to.len(), 1);
                    prop_assert!(to[0] < r.groups().len());
                }
            }
        }
    }
}
