//! Building blocks of end-to-end tests: a bpffs pin directory that removes itself, and
//! "flood a veth pair from its namespace while counting what arrives".

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    frame::FrameBuilder,
    netns::{ifindex, spawn_in_netns, VethPair},
    traffic::{PacketSocket, ReceiveReport, Receiver, SendPlan, SendReport},
};

/// The build `Program::attach` tries first in `mode`: the only one a test that attaches
/// once needs verified up front. `Program::load` verifies all three builds, each of them
/// seconds of a guest's emulated verifier (`e2e` in CI's 6.1 guest: 61 s with all three);
/// a build the attach falls back to (the multi-buffer build at a jumbo MTU) is verified
/// when it is tried, and every build's verification is `kernel_report`'s check.
pub fn first_build(
    mode: limiter_user::config::XdpMode,
) -> &'static [limiter_user::host::object::Variant] {
    use limiter_user::{config::XdpMode, host::object::Variant};
    match mode {
        XdpMode::Native | XdpMode::Auto => &[Variant::Linear],
        XdpMode::Generic => &[Variant::MultiBuffer],
        XdpMode::Tc => &[Variant::Tc],
    }
}

/// The program for a test that attaches once in `mode`: its [`first_build`] verified,
/// the maps pinned under `pins`, room for 1,024 sources.
pub fn load_for(
    mode: limiter_user::config::XdpMode,
    pins: &PinDir,
) -> Result<limiter_user::attach::program::Program> {
    use limiter_user::attach::program::{LoadOptions, Program};
    let opts = LoadOptions {
        pin_dir: Some(pins.path.clone()),
        max_sources: 1024,
        handoff_array: None,
    };
    Program::load_builds(&opts, first_build(mode)).context("loading the program")
}

/// Address of the sending (peer) end.
pub const PEER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Address the traffic is sent to (the limited end).
pub const HOST_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

static NEXT_PIN: AtomicU32 = AtomicU32::new(0);

/// A pin directory under /sys/fs/bpf, removed with everything in it on drop.
pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    pub fn new() -> PinDir {
        let n = NEXT_PIN.fetch_add(1, Ordering::Relaxed);
        PinDir {
            path: PathBuf::from(format!(
                "/sys/fs/bpf/limiter-test-{}-{n}",
                std::process::id()
            )),
        }
    }
}

impl Default for PinDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        // Unlinking a pin releases the kernel object once nothing else holds it.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A UDP frame from the peer to the host, addressed to the host's MAC.
pub fn udp_to_host(pair: &VethPair, dst_port: u16, frame_len: usize) -> Vec<u8> {
    FrameBuilder::ipv4(PEER_V4, HOST_V4)
        .macs(pair.peer_mac, pair.host_mac)
        .udp(40000, dst_port)
        .frame_len(frame_len)
        .build()
}

/// True for IPv4 frames to `dst` (untagged).
pub fn is_ipv4_to(frame: &[u8], dst: Ipv4Addr) -> bool {
    frame.len() >= 34 && frame[12..14] == [0x08, 0x00] && frame[30..34] == dst.octets()
}

/// Sends `plan` from the peer's namespace while counting, on the host end, the frames
/// to [`HOST_V4`] that arrive (i.e. that XDP passed).
pub fn flood(pair: &VethPair, plan: SendPlan) -> Result<(SendReport, ReceiveReport)> {
    let (sent, received) = flood_timed(pair, plan)?;
    Ok((sent.report, received))
}

/// [`flood`], with the sender's time line ([`send_timed`]), for a test that models what
/// the meter should have admitted of the arrivals that really happened.
pub fn flood_timed(pair: &VethPair, plan: SendPlan) -> Result<(TimedReport, ReceiveReport)> {
    let receiver = Receiver::start(pair.host_ifindex()?, |f| is_ipv4_to(f, HOST_V4))?;
    let peer = pair.peer.clone();
    let sender = spawn_in_netns(&pair.ns, move || -> Result<TimedReport> {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        send_timed(&socket, &plan)
    })?;
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender thread panicked"))???;
    let received = receiver.finish(Duration::from_millis(300))?;
    Ok((sent, received))
}

/// Writes `text` to a config file in `dir`.
pub fn write_config(dir: &Path, text: &str) -> Result<PathBuf> {
    let path = dir.join("limiter.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

// ---- senders with a time line, and a model of what the limiter should admit ----------

/// One `sendmmsg` that took frames: when it returned, and which frames of the sender's
/// sequence it took (`first..first + count`; frame `k` of the sequence is
/// `plan.frames[k % plan.frames.len()]`).
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub at: Instant,
    pub first: u64,
    pub count: u32,
}

/// [`send`](crate::traffic::send), also recording every batch with the instant it was
/// handed over. On a veth the frames go through the receiving end's XDP inside the
/// `sendmmsg` call (NAPI / backlog run when the call re-enables bottom halves), so the
/// time line says when XDP saw them, to within a batch.
pub fn send_recorded(socket: &PacketSocket, plan: &SendPlan) -> Result<(SendReport, Vec<Batch>)> {
    let mut batches: Vec<Batch> = Vec::new();
    let report = crate::traffic::send_observed(socket, plan, |at, first, count| {
        batches.push(Batch {
            at,
            first,
            count: count as u32,
        });
    })?;
    Ok((report, batches))
}

/// One sender's report, its time line, and the instants that bracket its whole sending
/// (just before its first and just after its last `sendmmsg`).
#[derive(Clone, Debug)]
pub struct TimedReport {
    pub report: SendReport,
    pub batches: Vec<Batch>,
    /// Length of the sender's frame list.
    pub list_len: usize,
    pub started: Instant,
    pub finished: Instant,
}

/// [`send_recorded`], bracketed by the instants just before and just after it.
pub fn send_timed(socket: &PacketSocket, plan: &SendPlan) -> Result<TimedReport> {
    let started = Instant::now();
    let (report, batches) = send_recorded(socket, plan)?;
    Ok(TimedReport {
        report,
        batches,
        list_len: plan.frames.len(),
        started,
        finished: Instant::now(),
    })
}

/// Sends every plan at once, each from its own thread in the peer's namespace (pinned by
/// its plan's `cpu`); all threads open their socket first and start together. Returns
/// the reports in plan order.
pub fn send_together(pair: &VethPair, plans: Vec<SendPlan>) -> Result<Vec<TimedReport>> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(plans.len()));
    let mut handles = Vec::new();
    for plan in plans {
        let peer = pair.peer.clone();
        let barrier = std::sync::Arc::clone(&barrier);
        handles.push(spawn_in_netns(&pair.ns, move || -> Result<TimedReport> {
            let socket = ifindex(&peer).and_then(|i| PacketSocket::bind(i, false));
            // Wait even on error, or the other senders would wait forever.
            barrier.wait();
            send_timed(&socket?, &plan)
        })?);
    }
    let mut reports = Vec::new();
    for h in handles {
        reports.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("sender thread panicked"))???,
        );
    }
    Ok(reports)
}

/// From the first sender's start to the last one's end: a bound on the time over which
/// frames of `reports` reached XDP (tight to a few microseconds).
pub fn union_span(reports: &[TimedReport]) -> Duration {
    let start = reports.iter().map(|r| r.started).min();
    let end = reports.iter().map(|r| r.finished).max();
    match (start, end) {
        (Some(s), Some(e)) => e.duration_since(s),
        _ => Duration::ZERO,
    }
}

/// What a set of senders did: their reports, the time T from the first one's start to
/// the last one's end, and the frames sent in all.
pub struct Run {
    pub reports: Vec<TimedReport>,
    /// Seconds from the first sender's start to the last one's end.
    pub t: f64,
    pub sent: u64,
}

impl Run {
    /// Sends `plans` together (see [`send_together`]), then waits `settle` for frames in
    /// flight before the caller reads counters.
    pub fn send(pair: &VethPair, plans: Vec<SendPlan>, settle: Duration) -> Result<Run> {
        let reports = send_together(pair, plans)?;
        std::thread::sleep(settle);
        let t = union_span(&reports).as_secs_f64();
        let sent = reports.iter().map(|r| r.report.sent).sum();
        Ok(Run { reports, t, sent })
    }

    /// Longest time between two consecutive batches (any sender): how long the offer
    /// stalled at worst.
    pub fn longest_gap(&self) -> Duration {
        let mut ats: Vec<Instant> = self
            .reports
            .iter()
            .flat_map(|r| r.batches.iter().map(|b| b.at))
            .collect();
        ats.sort();
        ats.windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .max()
            .unwrap_or_default()
    }
}

/// Whether a run's traffic came out as planned; `Err` says why not.
pub type Premise = std::result::Result<(), String>;

/// Runs `attempt` until its premise holds (at most `attempts` times), then fails on that
/// attempt's failed checks. A run whose traffic was not as planned (a sender descheduled
/// on a shared machine, frames lost before XDP) proves nothing either way, so it is
/// neither passed nor failed but repeated, after a pause that grows with each attempt
/// (5 s, 10 s, …) to let a burst of other load on the machine pass; if it never comes
/// out as planned, that fails.
pub fn with_retries(label: &str, attempts: u32, mut attempt: impl FnMut() -> (Checks, Premise)) {
    for i in 1..=attempts {
        let (checks, premise) = attempt();
        match premise {
            Ok(()) => return checks.finish(),
            Err(why) => eprintln!("  {label}: attempt {i}: traffic not as planned ({why})"),
        }
        if i < attempts {
            std::thread::sleep(Duration::from_secs(5 * u64::from(i)));
        }
    }
    panic!("{label}: the traffic did not come out as planned in {attempts} attempts");
}

/// Every frame the senders sent, in the order of the batches' instants: calls
/// `f(at, sender, entry)` with the index `entry` of the frame in its sender's list.
pub fn for_each_frame(reports: &[TimedReport], mut f: impl FnMut(Instant, usize, usize)) {
    let mut all: Vec<(Instant, usize, Batch)> = reports
        .iter()
        .enumerate()
        .flat_map(|(s, r)| r.batches.iter().map(move |b| (b.at, s, *b)))
        .collect();
    all.sort_by_key(|(at, s, _)| (*at, *s));
    for (at, s, b) in all {
        let len = reports[s].list_len as u64;
        for k in b.first..b.first + u64::from(b.count) {
            f(at, s, (k % len) as usize);
        }
    }
}

/// An independent model of the meter, to compute what the limiter should have admitted
/// for the arrivals that really happened: a token bucket in floating point holding up to
/// `burst` units, refilled at `rate` units per second, full at its first frame. A frame
/// of `cost` units conforms when the bucket holds at least `cost` (GCRA with tolerance =
/// cost of the burst is the same decision).
#[derive(Clone, Debug)]
pub struct ModelBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl ModelBucket {
    pub fn new(rate: u64, burst: u64) -> ModelBucket {
        ModelBucket {
            rate: rate as f64,
            burst: burst as f64,
            tokens: burst as f64,
            last: None,
        }
    }

    /// Offers a frame of `cost` units arriving `at`; true if it conforms (and is charged).
    pub fn offer(&mut self, at: Instant, cost: f64) -> bool {
        if let Some(last) = self.last {
            let dt = at.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        }
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }
}

/// What one bucket of `rate` units/s and `burst` units, full at the first frame, admits
/// of the frames in `reports` whose entry in their sender's list `metered` selects, at
/// one unit each, in the order the batches went out: the count a single rule's aggregate
/// should have passed of the offer that really happened, stalls included.
pub fn model_admits(
    reports: &[TimedReport],
    rate: u64,
    burst: u64,
    metered: impl Fn(usize) -> bool,
) -> u64 {
    let mut bucket = ModelBucket::new(rate, burst);
    let mut admitted = 0;
    for_each_frame(reports, |at, _, entry| {
        if metered(entry) && bucket.offer(at, 1.0) {
            admitted += 1;
        }
    });
    admitted
}

/// Frames sent of each entry of a frame list when `sent` frames went out cycling through
/// a list of `len` entries from its start: entry `i` went out this many times.
pub fn sent_of_entry(sent: u64, len: usize, i: usize) -> u64 {
    let len = len as u64;
    sent / len + u64::from((i as u64) < sent % len)
}

// ---- the limiter on a veth pair ----------------------------------------------------------

/// The limiter loaded with a config's rules and attached to the host end of a fresh veth
/// pair, with an [`RxCounter`](crate::rx::RxCounter) behind it counting what XDP passed.
/// Fields drop in order: the counter and the program detach before the pair goes.
pub struct Limited {
    pub rx: crate::rx::RxCounter,
    pub maps: limiter_user::bpf::maps::Maps,
    pub program: limiter_user::attach::program::Program,
    pub table: limiter_user::policy::ruleset::RuleTable,
    pub mode: limiter_user::attach::program::AttachedMode,
    pub pair: VethPair,
}

impl Limited {
    /// A pair with `queues` queues, the program loaded with `config_text`'s rules and
    /// `max_sources` (maps pinned under `pin_dir` when given), attached in `mode`;
    /// fails unless it attached in exactly that mode.
    pub fn new(
        queues: u32,
        mode: limiter_user::config::XdpMode,
        config_text: &str,
        pin_dir: Option<&Path>,
    ) -> Result<Limited> {
        use limiter_user::{
            attach::program::{AttachedMode, LoadOptions, Program},
            config::{Config, XdpMode},
            daemon::apply_rules,
        };
        let pair = VethPair::new(queues)?;
        let config = Config::parse(config_text, Path::new("<scenario config>"))?;
        let mut program = Program::load_builds(
            &LoadOptions {
                pin_dir: pin_dir.map(Path::to_path_buf),
                max_sources: config.max_sources,
                handoff_array: None,
            },
            first_build(mode),
        )?;
        let mut maps = program.maps()?;
        let table = apply_rules(&mut maps, &config)?;
        let attachment = program.attach(&pair.host, mode)?;
        let wanted = match mode {
            XdpMode::Native => Some(AttachedMode::Native),
            XdpMode::Generic => Some(AttachedMode::Generic),
            XdpMode::Tc => Some(AttachedMode::Tc),
            XdpMode::Auto => None,
        };
        if wanted.is_some_and(|w| w != attachment.mode) {
            anyhow::bail!(
                "asked for {mode:?} XDP, attached in {}",
                attachment.mode.as_str()
            );
        }
        let rx = crate::rx::RxCounter::attach(&pair.host)?;
        Ok(Limited {
            rx,
            maps,
            program,
            table,
            mode: attachment.mode,
            pair,
        })
    }

    /// Slot of rule `name`.
    pub fn slot(&self, name: &str) -> Result<u32> {
        self.table
            .slots
            .get(name)
            .copied()
            .with_context(|| format!("no rule {name}"))
    }

    /// Counters of rule `name`, summed over CPUs.
    pub fn counters(&self, name: &str) -> Result<limiter_common::abi::RuleCounters> {
        Ok(self.maps.rule_counters(self.slot(name)?)?)
    }

    /// Bytes the [`RxCounter`](crate::rx::RxCounter) reports for frames that XDP passed
    /// carrying `l2_bytes` of Ethernet header (and tags) each, `packets` of them. Behind
    /// a generic-mode XDP program, TC ingress sees the frame from its network header on
    /// (kernel behaviour, measured with a trivial XDP_PASS program too), so it counts
    /// `l2_bytes` less per frame.
    pub fn rx_bytes_for(&self, bytes: u64, packets: u64, l2_bytes: u64) -> u64 {
        match self.mode {
            limiter_user::attach::program::AttachedMode::Native
            | limiter_user::attach::program::AttachedMode::Tc => bytes,
            limiter_user::attach::program::AttachedMode::Generic => bytes - packets * l2_bytes,
        }
    }
}

/// Frames that XDP passed, per IPv4 source (untagged frames). In native mode from the
/// exact TC ingress counter; in generic mode the TC counter cannot see the Ethernet
/// header (see [`Limited::rx_bytes_for`]) and so no source, so an AF_PACKET receiver
/// counts instead, which keeps up only with some 100k frames/s.
pub enum SourceCount {
    Tc,
    Socket {
        receiver: Receiver,
        counts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Ipv4Addr, u64>>>,
    },
}

impl SourceCount {
    /// Starts counting (before the traffic).
    pub fn start(rig: &Limited) -> Result<SourceCount> {
        if rig.mode != limiter_user::attach::program::AttachedMode::Generic {
            return Ok(SourceCount::Tc);
        }
        let counts = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let sink = std::sync::Arc::clone(&counts);
        let receiver = Receiver::start(rig.pair.host_ifindex()?, move |f| {
            if f.len() >= 34 && f[12..14] == [0x08, 0x00] {
                let src = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
                if let Ok(mut counts) = sink.lock() {
                    *counts.entry(src).or_insert(0) += 1;
                }
            }
            true
        })?;
        Ok(SourceCount::Socket { receiver, counts })
    }

    /// Stops and returns frames per source; fails if the receiver lost frames.
    pub fn finish(self, rig: &Limited) -> Result<std::collections::BTreeMap<Ipv4Addr, u64>> {
        match self {
            SourceCount::Tc => rig.rx.per_source(),
            SourceCount::Socket { receiver, counts } => {
                let report = receiver.finish(Duration::from_millis(100))?;
                if report.socket_drops != 0 {
                    anyhow::bail!(
                        "the AF_PACKET receiver dropped {} frames: per-source counts unknown",
                        report.socket_drops
                    );
                }
                let counts = counts
                    .lock()
                    .map_err(|_| anyhow::anyhow!("receiver count lock poisoned"))?;
                Ok(counts.iter().map(|(k, v)| (*k, *v)).collect())
            }
        }
    }
}

/// Collects failed checks so a scenario reports every problem, then fails once.
#[derive(Debug, Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    pub fn new() -> Checks {
        Checks::default()
    }

    /// Records `what` as a failure unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            eprintln!("  FAILED: {what}");
            self.failed.push(what);
        }
    }

    /// Panics listing every failure, if any.
    pub fn finish(self) {
        assert!(
            self.failed.is_empty(),
            "{} check(s) failed:\n  {}",
            self.failed.len(),
            self.failed.join("\n  ")
        );
    }
}
