//! What sits on the limited (host) end of the pair in a measurement, and the interface's
//! own counters, which count every frame that reached it whatever handled it.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::{
    programs::{SchedClassifier, TcAttachType, Xdp, XdpMode},
    Ebpf,
};
use limiter_common::drop::{MonitorConfig, MonitorCounters};
use limiter_tests::{
    fixture::{self, Loaded, Snapshot},
    scenario::HOST_V4,
};
use limiter_user::{
    attach::program::AttachedMode, config::XdpMode as ConfigXdpMode, host::object::BASELINE_OBJECT,
};

use super::nft::{NftLimit, NftTable};

/// Frames the host end has received (`rx_packets`: for veth with XDP, every frame XDP
/// ran on, whatever its verdict) and dropped before XDP or the stack saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub rx_dropped: u64,
}

impl LinkStats {
    pub fn read(iface: &str) -> Result<LinkStats> {
        Ok(LinkStats {
            rx_packets: read_stat(iface, "rx_packets")?,
            rx_dropped: read_stat(iface, "rx_dropped")?,
        })
    }

    pub fn since(&self, before: &LinkStats) -> LinkStats {
        LinkStats {
            rx_packets: self.rx_packets.wrapping_sub(before.rx_packets),
            rx_dropped: self.rx_dropped.wrapping_sub(before.rx_dropped),
        }
    }
}

fn read_stat(iface: &str, name: &str) -> Result<u64> {
    let path = format!("/sys/class/net/{iface}/statistics/{name}");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("parsing {path}: {text:?}"))
}

/// A trivial program of the baseline object attached in native mode; detached on drop.
pub struct Baseline {
    _ebpf: Ebpf,
}

impl Baseline {
    /// `name`: `baseline_pass` or `baseline_drop`.
    pub fn attach(iface: &str, name: &str) -> Result<Baseline> {
        let mut ebpf = Ebpf::load(BASELINE_OBJECT).context("loading the baseline object")?;
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not XDP"))?;
        prog.load().with_context(|| format!("loading {name}"))?;
        prog.attach(iface, XdpMode::Driver)
            .with_context(|| format!("attaching {name} to {iface} (native)"))?;
        Ok(Baseline { _ebpf: ebpf })
    }

    /// A classifier of the baseline object at `iface`'s TC ingress.
    pub fn attach_tc(iface: &str, name: &str) -> Result<Baseline> {
        let mut ebpf = Ebpf::load(BASELINE_OBJECT).context("loading the baseline object")?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not a classifier"))?;
        prog.load().with_context(|| format!("loading {name}"))?;
        prog.attach(iface, TcAttachType::Ingress)
            .with_context(|| format!("attaching {name} to {iface} TC ingress"))?;
        Ok(Baseline { _ebpf: ebpf })
    }
}

/// The limiter loaded with a config and attached in native XDP mode or at TC ingress;
/// detached on drop.
pub struct Limiter {
    pub loaded: Loaded,
}

impl Limiter {
    /// `mode`: `Native` or `Tc`.
    pub fn attach(iface: &str, config: &str, mode: ConfigXdpMode) -> Result<Limiter> {
        let mut loaded = fixture::load(config).context("loading the limiter")?;
        let attachment = loaded
            .program
            .attach(iface, mode)
            .with_context(|| format!("attaching the limiter to {iface}"))?;
        let wanted = match mode {
            ConfigXdpMode::Tc => AttachedMode::Tc,
            _ => AttachedMode::Native,
        };
        anyhow::ensure!(
            attachment.mode == wanted,
            "the limiter attached in {} mode, not {}",
            attachment.mode.as_str(),
            wanted.as_str()
        );
        // The program (and with it the link) lives as long as `loaded`.
        Ok(Limiter { loaded })
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        self.loaded.snapshot()
    }
}

/// The rule name every benchmark limiter config uses (see [`super::limiter_config`]).
pub const RULE_NAME: &str = "bench";

/// One configuration of the host end.
#[derive(Clone, Debug)]
pub enum Setup {
    /// Nothing attached: the stack drops the frames (the host end has no address).
    Stack,
    /// `baseline_pass`, the stack behind it. On the live-frames path this is the
    /// reference "nothing": a veth delivers XDP frames only to an end with XDP (or GRO).
    XdpPass,
    /// `baseline_drop`.
    XdpDrop,
    /// `baseline_tc_drop` at TC ingress, no XDP program.
    TcDrop,
    /// The limiter with one rule; `limits` as for [`super::limiter_config`].
    Limiter { limits: String },
    /// The same, its TC build at TC ingress (`xdp_mode = "tc"`).
    LimiterTc { limits: String },
    /// The limiter as in `Limiter`, sampling its refusals at `events_per_sec` per CPU
    /// (`[monitor] events_per_sec`), the ring buffer drained by a thread as `limiter
    /// monitor` drains it.
    LimiterSampling { limits: String, events_per_sec: u32 },
    /// nftables in netdev ingress; `xdp_pass` puts `baseline_pass` in front (live path).
    Nft { limit: NftLimit, xdp_pass: bool },
}

/// What a setup says it dropped, for checking a measurement did what it claims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Frames the limiting rule saw (limiter only: its passed + dropped).
    pub counted: Option<u64>,
    pub dropped: u64,
}

/// A setup installed on the host end; everything is removed on drop.
pub struct Installed {
    _baseline: Option<Baseline>,
    limiter: Option<Limiter>,
    nft: Option<NftTable>,
    sampling: Option<Sampling>,
}

/// The ring buffer's reader of a `LimiterSampling` setup.
struct Sampling {
    reader: RingReader,
    before: MonitorCounters,
}

/// A thread draining a `DROP_EVENTS` ring buffer as `limiter monitor` drains it (every
/// 10 ms), counting the events; stopped by [`RingReader::finish`] or on drop.
pub struct RingReader {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<u64>>,
}

impl RingReader {
    pub fn start(mut ring: aya::maps::RingBuf<aya::maps::MapData>) -> RingReader {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut read = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    while ring.next().is_some() {
                        read += 1;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                while ring.next().is_some() {
                    read += 1;
                }
                read
            })
        };
        RingReader {
            stop,
            reader: Some(reader),
        }
    }

    /// Stops the thread once it has drained the ring; the events it read.
    pub fn finish(&mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.reader.take() {
            Some(reader) => reader
                .join()
                .map_err(|_| anyhow::anyhow!("the ring buffer's reader panicked")),
            None => Ok(0),
        }
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// What sampling did over a run: the program's counters' change and the events read.
#[derive(Clone, Copy, Debug, Default)]
pub struct SamplingTally {
    pub counters: MonitorCounters,
    pub read: u64,
}

impl Sampling {
    fn start(limiter: &mut Limiter, events_per_sec: u32) -> Result<Sampling> {
        let maps = &mut limiter.loaded.maps;
        maps.set_monitor_config(MonitorConfig {
            events_per_sec,
            snap_len: 128,
        })
        .context("turning sampling on")?;
        let ring = maps
            .take_drop_events()
            .context("the program has no DROP_EVENTS ring buffer")?;
        let before = maps.monitor_counters()?;
        Ok(Sampling {
            reader: RingReader::start(ring),
            before,
        })
    }
}

impl Installed {
    pub fn new(iface: &str, setup: &Setup) -> Result<Installed> {
        let mut installed = Installed {
            _baseline: None,
            limiter: None,
            nft: None,
            sampling: None,
        };
        match setup {
            Setup::Stack => {}
            Setup::XdpPass => installed._baseline = Some(Baseline::attach(iface, "baseline_pass")?),
            Setup::XdpDrop => installed._baseline = Some(Baseline::attach(iface, "baseline_drop")?),
            Setup::TcDrop => {
                installed._baseline = Some(Baseline::attach_tc(iface, "baseline_tc_drop")?)
            }
            Setup::Limiter { limits } => {
                let config = super::limiter_config(RULE_NAME, limits);
                installed.limiter = Some(Limiter::attach(iface, &config, ConfigXdpMode::Native)?);
            }
            Setup::LimiterSampling {
                limits,
                events_per_sec,
            } => {
                let config = super::limiter_config(RULE_NAME, limits);
                let mut limiter = Limiter::attach(iface, &config, ConfigXdpMode::Native)?;
                installed.sampling = Some(Sampling::start(&mut limiter, *events_per_sec)?);
                installed.limiter = Some(limiter);
            }
            Setup::LimiterTc { limits } => {
                let config = super::limiter_config(RULE_NAME, limits);
                installed.limiter = Some(Limiter::attach(iface, &config, ConfigXdpMode::Tc)?);
            }
            Setup::Nft { limit, xdp_pass } => {
                installed.nft = Some(NftTable::install(iface, HOST_V4, *limit)?);
                if *xdp_pass {
                    installed._baseline = Some(Baseline::attach(iface, "baseline_pass")?);
                }
            }
        }
        Ok(installed)
    }

    pub fn limiter(&self) -> Option<&Limiter> {
        self.limiter.as_ref()
    }

    /// Stops a `LimiterSampling` setup's reader (after it has drained the ring) and says
    /// what sampling did since it started; `None` for other setups.
    pub fn finish_sampling(&mut self) -> Result<Option<SamplingTally>> {
        let (Some(sampling), Some(limiter)) = (&mut self.sampling, &self.limiter) else {
            return Ok(None);
        };
        let read = sampling.reader.finish()?;
        let now = limiter.loaded.maps.monitor_counters()?;
        let before = sampling.before;
        Ok(Some(SamplingTally {
            counters: MonitorCounters {
                sampled: now.sampled.wrapping_sub(before.sampled),
                skipped_budget: now.skipped_budget.wrapping_sub(before.skipped_budget),
                lost_full: now.lost_full.wrapping_sub(before.lost_full),
            },
            read,
        }))
    }

    /// Totals so far of the limiting rule, if the setup has one.
    pub fn verdicts(&self) -> Result<Option<Verdicts>> {
        if let Some(limiter) = &self.limiter {
            let snapshot = limiter.snapshot()?;
            let rule = snapshot
                .rules
                .get(RULE_NAME)
                .with_context(|| format!("no counters for rule {RULE_NAME}"))?;
            return Ok(Some(Verdicts {
                counted: Some(rule.passed_packets + rule.dropped_packets),
                dropped: rule.dropped_packets,
            }));
        }
        if let Some(nft) = &self.nft {
            return Ok(Some(Verdicts {
                counted: None,
                dropped: nft.dropped()?,
            }));
        }
        Ok(None)
    }
}
