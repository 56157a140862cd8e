//! `limiter monitor`'s filters: by rule name, by reason label, by source prefix. Each
//! kind given matches when any of its values does; kinds not given match everything.

use ipnet::IpNet;
use limiter_common::drop::DropReason;

use super::{event::Event, format::RuleName};

/// `--reason LABEL`: one of [`DropReason::label`]'s, or an error naming them all.
pub fn parse_reason(label: &str) -> Result<DropReason, String> {
    DropReason::ALL
        .iter()
        .copied()
        .find(|r| r.label() == label.trim())
        .ok_or_else(|| {
            let valid: Vec<&str> = DropReason::ALL.iter().map(|r| r.label()).collect();
            format!(
                "unknown reason {label:?}; the reasons are: {}",
                valid.join(", ")
            )
        })
}

/// `--source PREFIX`: a CIDR prefix (v4 or v6), or a single address.
pub fn parse_source(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("expected a prefix such as 198.51.100.0/24 or 2001:db8::/32, got {text:?}")
        })
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub rules: Vec<String>,
    pub reasons: Vec<DropReason>,
    pub sources: Vec<IpNet>,
}

impl Filter {
    /// Whether `e`, whose rule resolved to `rule`, is shown.
    pub fn matches(&self, e: &Event, rule: &RuleName) -> bool {
        let rule_ok = self.rules.is_empty()
            || rule
                .name()
                .is_some_and(|name| self.rules.iter().any(|r| r == name));
        let reason_ok =
            self.reasons.is_empty() || e.reason.is_ok_and(|r| self.reasons.contains(&r));
        let source_ok = self.sources.is_empty()
            || e.src
                .is_some_and(|src| self.sources.iter().any(|p| p.contains(&src)));
        rule_ok && reason_ok && source_ok
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::net::IpAddr;

    use limiter_common::drop::EVENT_DROPPED;
    use proptest::prelude::*;

    use super::*;
    use crate::observe::monitor::event::{decode, raw_event};

    fn event(src: &str, reason: DropReason) -> Event {
        let src: IpAddr = src.parse().unwrap();
        let dst: IpAddr = if src.is_ipv4() {
            "198.18.0.10".parse().unwrap()
        } else {
            "2001:db8::10".parse().unwrap()
        };
        decode(&raw_event(
            &[0u8; 60],
            src,
            dst,
            17,
            (1, 2),
            reason,
            EVENT_DROPPED,
            0,
        ))
    }

    #[test]
    fn unknown_reasons_are_refused_naming_the_valid_ones() {
        assert_eq!(parse_reason("per_source"), Ok(DropReason::PerSource));
        let err = parse_reason("per-source").unwrap_err();
        for r in DropReason::ALL {
            assert!(err.contains(r.label()), "{err}");
        }
        assert!(parse_source("198.51.100.0/24").is_ok());
        assert_eq!(
            parse_source("2001:db8::1").unwrap(),
            "2001:db8::1/128".parse::<IpNet>().unwrap()
        );
        assert!(parse_source("198.51.100.0/33").is_err());
    }

    #[test]
    fn each_kind_narrows_and_values_of_a_kind_widen() {
        let web = RuleName::Named("web".into());
        let e = event("198.51.100.7", DropReason::PerSource);
        assert!(Filter::default().matches(&e, &web));
        let f = Filter {
            rules: vec!["dns".into(), "web".into()],
            reasons: vec![DropReason::Aggregate, DropReason::PerSource],
            sources: vec![parse_source("198.51.100.0/24").unwrap()],
        };
        assert!(f.matches(&e, &web));
        assert!(!f.matches(&e, &RuleName::Named("api".into())));
        assert!(!f.matches(&e, &RuleName::None), "no rule matches no name");
        assert!(!f.matches(&event("198.51.101.7", DropReason::PerSource), &web));
        assert!(!f.matches(&event("198.51.100.7", DropReason::ShareSpent), &web));
        let v6 = Filter {
            sources: vec![parse_source("2001:db8::/32").unwrap()],
            ..Filter::default()
        };
        assert!(v6.matches(&event("2001:db8:5::1", DropReason::Aggregate), &web));
        assert!(!v6.matches(&e, &web));
        let mut unread = event("198.51.100.7", DropReason::DeepVlan);
        unread.src = None;
        unread.rule_slot = None;
        assert!(!f.matches(&unread, &RuleName::None));
        assert!(Filter::default().matches(&unread, &RuleName::None));
    }

    proptest! {
        /// A source filter matches exactly the sources its prefix covers, as bit
        /// arithmetic says.
        #[test]
        fn source_prefixes_match_by_their_bits(a in any::<u32>(), b in any::<u32>(), len in 0u8..=32) {
            let prefix = IpNet::new(IpAddr::from(a.to_be_bytes()), len).unwrap().trunc();
            let f = Filter { sources: vec![prefix], ..Filter::default() };
            let e = event(&IpAddr::from(b.to_be_bytes()).to_string(), DropReason::Aggregate);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            prop_assert_eq!(f.matches(&e, &RuleName::None), a & mask == b & mask);
        }
    }
}
