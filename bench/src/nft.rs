//! nftables doing the limiter's job in a netdev ingress chain on the host end: the
//! comparison rows of the CPU-cost table. Each table has a name unique to this process
//! and is deleted on drop, also when a measurement fails.

use std::{
    io::Write as _,
    net::Ipv4Addr,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{bail, Context as _, Result};

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
        nft(&["-f", "-"], Some(&script)).context("installing the nftables comparison table")?;
        Ok(table)
    }

    /// Packets the limiting rule dropped (its `counter`).
    pub fn dropped(&self) -> Result<u64> {
        let listing = nft(&["list", "table", "netdev", &self.name], None)?;
        let line = listing
            .lines()
            .find(|l| l.contains("comment \"over\""))
            .with_context(|| format!("no limiting rule in:\n{listing}"))?;
        let rest = line
            .split_once("counter packets ")
            .with_context(|| format!("no counter in: {line}"))?
            .1;
        let number = rest.split_whitespace().next().unwrap_or_default();
        number
            .parse()
            .with_context(|| format!("parsing the counter of: {line}"))
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "netdev", &self.name])
            .output();
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

/// Runs `nft args` (with `stdin` piped in); returns its stdout, fails with its stderr.
fn nft(args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `nft` (nftables missing? `cargo xtask setup` installs it)")?;
    {
        let mut pipe = child.stdin.take().context("nft has no stdin")?;
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes())
                .context("writing the nft script")?;
        }
    }
    let out = child.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        bail!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("nft printed non-UTF-8")
}
