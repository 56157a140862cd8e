//! limiter-bench: the benchmark (`src/bin/limiter-bench.rs`, run by `cargo xtask bench`) and
//! the self-contained lab (`src/bin/limiter-lab.rs`, run by `cargo xtask run`), both on the
//! kernel test harness of limiter-tests; and the fleet lab ([`fleet_lab`], `src/bin/limiter-fleet-lab.rs`,
//! run by `cargo xtask run -- --fleet`).
//!
//! This library is the end-to-end part of `cargo xtask bench`: real frames over a veth
//! pair, the limiter attached in native mode to the host end, every figure a ratio to a
//! reference measured in the same run on the same path.
//!
//! - [`drop_rate`]: frames/s the limiter drops vs a plain XDP_DROP program;
//! - [`cpu_cost`]: CPU time per frame vs nftables doing the same job, at a paced offer;
//! - [`accuracy`]: admitted vs configured rate, an offered-rate sweep and a burst timeline;
//! - [`flood`]: a spoofed-source flood against a good and a heavy source (its own part,
//!   `flood`, with its own report);
//! - [`allocator`]: reports/s one allocator handles on one core, its state driven
//!   directly (its own part, `allocator-capacity`, with its own report);
//! - [`report`]: `target/bench/report.md`, and its plots through limiter-plot.

pub mod accuracy;
pub mod allocator;
pub mod cpu;
pub mod cpu_cost;
pub mod drop_rate;
pub mod fleet_lab;
pub mod flood;
pub mod gen;
pub mod host;
pub mod nft;
pub mod report;
pub mod soak;
pub mod stats;

use std::net::Ipv4Addr;

use anyhow::{ensure, Context as _, Result};
use limiter_tests::{
    frame::FrameBuilder,
    netns::VethPair,
    scenario::{HOST_V4, PEER_V4},
};

use self::{accuracy::Accuracy, cpu_cost::CostTable, drop_rate::DropRateRow};

/// Senders run on these CPUs, one each; the pair has one queue per sender, so XDP runs on
/// both CPUs at once.
pub const SENDER_CPUS: [usize; 2] = [0, 1];
/// Frame length on the wire (no FCS) unless a measurement says otherwise.
pub const FRAME_LEN: usize = 64;
/// UDP destination port of every frame.
pub const DST_PORT: u16 = 9;

/// The pair every end-to-end measurement uses: one queue per sender CPU.
pub fn veth_pair() -> Result<VethPair> {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    ensure!(
        cpus >= SENDER_CPUS.len() as i64,
        "the end-to-end benchmark needs {} CPUs, this machine has {cpus}",
        SENDER_CPUS.len()
    );
    VethPair::new(SENDER_CPUS.len() as u32).context("creating the benchmark's veth pair")
}

/// UDP frames of `len` bytes from the peer to [`HOST_V4`], one per source: `sources == 1`
/// is [`PEER_V4`] alone; more are 198.18.1.0, 198.18.1.1, … (at most 65,536).
pub fn udp_frames(pair: &VethPair, sources: u32, len: usize) -> Result<Vec<Vec<u8>>> {
    ensure!((1..=65_536).contains(&sources), "{sources} sources");
    let source = |i: u32| {
        if sources == 1 {
            PEER_V4
        } else {
            Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 1, 0)) + i)
        }
    };
    Ok((0..sources)
        .map(|i| {
            FrameBuilder::ipv4(source(i), HOST_V4)
                .macs(pair.peer_mac, pair.host_mac)
                .udp(40_000, DST_PORT)
                .frame_len(len)
                .build()
        })
        .collect())
}

/// A limiter config with one UDP rule for [`HOST_V4`]: `limits` are the TOML lines of
/// the rule's limits (e.g. `rate = 1000` and `burst = 100`, or a `[rules.per_source]`
/// table).
pub fn limiter_config(name: &str, limits: &str) -> String {
    format!(
        "max_sources = 65536\n\n[[rules]]\nname = \"{name}\"\ndst = \"{HOST_V4}/32\"\n\
         proto = \"udp\"\n{limits}\n"
    )
}

/// Runs `f`, and once more if it fails: a measurement is taken again when other load on
/// the machine kept the senders from offering what it needs (the first failure is
/// logged; a second one is the result).
pub fn twice<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    f().or_else(|e| {
        eprintln!("  measuring again after: {e:#}");
        f()
    })
}

/// Which parts of the end-to-end benchmark to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Parts {
    pub drop_rate: bool,
    pub cpu_cost: bool,
    pub accuracy: bool,
}

impl Parts {
    pub fn all() -> Parts {
        Parts {
            drop_rate: true,
            cpu_cost: true,
            accuracy: true,
        }
    }

    pub fn any(&self) -> bool {
        self.drop_rate || self.cpu_cost || self.accuracy
    }
}

/// Each part that ran; a part (or, in `accuracy`, a point) that failed holds its error.
pub struct Results {
    pub drop_rate: Option<Result<Vec<DropRateRow>>>,
    pub cpu_cost: Option<Result<Vec<CostTable>>>,
    pub accuracy: Option<Accuracy>,
}

/// Runs `parts` on one veth pair (removed at the end, also on failure).
pub fn run(parts: Parts) -> Result<Results> {
    let pair = veth_pair()?;
    let step = |name: &str| eprintln!("end to end: {name}…");
    let drop_rate = parts.drop_rate.then(|| {
        step("drop rate");
        drop_rate::measure(&pair)
    });
    let cpu_cost = parts.cpu_cost.then(|| {
        step("CPU cost per frame");
        cpu_cost::measure(&pair)
    });
    let accuracy = parts.accuracy.then(|| {
        step("accuracy");
        accuracy::measure(&pair)
    });
    Ok(Results {
        drop_rate,
        cpu_cost,
        accuracy,
    })
}
