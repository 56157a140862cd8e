//! nftables doing the limiter's job in a netdev ingress chain on the host end: the
//! comparison rows of the CPU-cost table. Each table has a name unique to this process
//! and is deleted on drop, also when a measurement fails.

use std::{
    net::Ipv4Addr,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result};
use limiter_tests::tools;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// What the chain enforces on UDP to one destination, like a limiter rule with
/// `proto = "udp"` and a /32 `dst`.
#[derive(Clone, Copy, Debug)]
pub enum NftLimit {
    /// `limit rate over R/second burst B packets drop`: all matching traffic together.
    Aggregate { rate: u64, burst: u64 },
    /// A dynamic set keyed by `ip saddr` with a `limit` per element (what `meter` becomes).
    PerSource { rate: u64, burst: u64 },
}

/// An installed `netdev` table; deleted on drop.
pub struct NftTable {
    name: String,
}

impl NftTable {
    pub fn install(device: &str, dst: Ipv4Addr, limit: NftLimit) -> Result<NftTable> {
        let name = format!(
            "limbench_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let script = script(&name, device, dst, limit);
        // From here on, Drop deletes the table (a failed `nft -f` leaves nothing, and the
        // delete then fails harmlessly).
        let table = NftTable { name };
        tools::nft(&["-f", "-"], Some(&script))
            .context("installing the nftables comparison table")?;
        Ok(table)
    }

    /// Packets the limiting rule dropped (its `counter`, from `nft -j list table`).
    pub fn dropped(&self) -> Result<u64> {
        tools::nft_rule_packets("netdev", &self.name, "over")
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        let _ = tools::nft(&["delete", "table", "netdev", &self.name], None);
    }
}

fn script(name: &str, device: &str, dst: Ipv4Addr, limit: NftLimit) -> String {
    let matches = format!("ip daddr {dst} meta l4proto udp");
    let (set, rule) = match limit {
        NftLimit::Aggregate { rate, burst } => (
            String::new(),
            format!("{matches} limit rate over {rate}/second burst {burst} packets"),
        ),
        NftLimit::PerSource { rate, burst } => (
            "set persrc { type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; }"
                .to_string(),
            format!(
                "{matches} update @persrc {{ ip saddr limit rate over {rate}/second \
                 burst {burst} packets }}"
            ),
        ),
    };
    format!(
        "table netdev {name} {{\n  {set}\n  chain ingress {{\n    type filter hook ingress \
         device \"{device}\" priority 0; policy accept;\n    {rule} counter drop comment \
         \"over\"\n  }}\n}}\n"
    )
}
