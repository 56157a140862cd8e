//! The fast traffic generator: BPF_PROG_TEST_RUN in live-frames mode running an XDP_TX
//! program on the peer end of a veth pair. Each injected frame is transmitted out of the
//! peer and arrives at the limited end as an XDP frame, the path a NIC driver gives, at
//! millions of frames per second per CPU.

use std::{
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    programs::{xdp::XdpMode, TestRun, TestRunAttrs, TestRunOptions, Xdp},
    Ebpf,
};
use limiter_user::host::object::BASELINE_OBJECT;

use crate::{
    netns::{ifindex, ip, spawn_in_netns, VethPair},
    traffic::{pin_to_cpu, SendPlan, SendReport},
};

/// Frames per BPF_PROG_TEST_RUN call when sending as fast as possible; each call sets up
/// a page pool, so fewer, larger calls go faster.
const UNPACED_CHUNK: u64 = 16_384;
/// Pacing granularity: a paced sender sends what is due every this often.
const PACE_TICK: Duration = Duration::from_micros(500);
/// Frames the kernel builds and transmits per batch inside one call.
const LIVE_BATCH: u32 = 64;

/// The XDP_TX generator program, loaded and ready to run.
///
/// Every XDP BPF_PROG_TEST_RUN call adds its program to the kernel's XDP dispatcher and
/// removes it afterwards; each change of the dispatcher waits for an RCU grace period
/// (≈ 24 ms idle per call, measured here), which left the senders idle a fifth of the
/// time. The sender keeps its program in the dispatcher for its lifetime instead, by
/// attaching it (generic mode) to an idle veth pair of its own, both ends down, in the
/// sender's namespace: test runs then only count users, and never wait.
pub struct LiveSender {
    ebpf: Ebpf,
    ifindex: u32,
    /// `traffic_tx`, or `traffic_tx_spray` (a random source per frame).
    program: &'static str,
    /// Dropped after `ebpf` (field order), so the link goes before the pair.
    _holder: Holder,
}

static NEXT_HOLDER: AtomicU32 = AtomicU32::new(0);

/// The idle veth pair that keeps a sender's program in the dispatcher; deleted on drop
/// (and with the namespace, if the process dies first).
struct Holder {
    name: String,
}

impl Holder {
    fn new() -> Result<Holder> {
        let id = NEXT_HOLDER.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes.
        let name = format!("lx{:x}{:x}a", std::process::id() % 0xfffff, id);
        let peer = format!("{}b", &name[..name.len() - 1]);
        // `ip` runs in the calling thread's network namespace (the sender's).
        ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer])
            .context("creating the dispatcher holder pair")?;
        Ok(Holder { name })
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; an error means it is already gone.
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

impl LiveSender {
    /// Loads the generator for interface `ifindex` of the calling thread's namespace
    /// (a test namespace: the holder pair is created there).
    pub fn new(ifindex: u32) -> Result<LiveSender> {
        LiveSender::with_program(ifindex, "traffic_tx")
    }

    /// The same with another generator of the baseline object (`traffic_tx_spray`).
    pub fn with_program(ifindex: u32, program: &'static str) -> Result<LiveSender> {
        Self::with_globals(ifindex, program, &[])
    }

    /// [`LiveSender::with_program`] with the harness object's read-only globals set.
    pub fn with_globals(
        ifindex: u32,
        program: &'static str,
        globals: &[(&str, u32)],
    ) -> Result<LiveSender> {
        let mut loader = aya::EbpfLoader::new();
        for (name, value) in globals {
            loader.override_global(name, value, true);
        }
        let mut ebpf = loader
            .load(BASELINE_OBJECT)
            .context("loading the harness programs")?;
        let prog: &mut Xdp = ebpf
            .program_mut(program)
            .with_context(|| format!("no {program} program"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {program}"))?;
        let holder = Holder::new()?;
        prog.attach(&holder.name, XdpMode::Skb)
            .with_context(|| format!("attaching {program} to {} (generic)", holder.name))?;
        Ok(LiveSender {
            ebpf,
            ifindex,
            program,
            _holder: holder,
        })
    }

    fn program(&self) -> Result<&Xdp> {
        Ok(self
            .ebpf
            .program(self.program)
            .with_context(|| format!("no {} program", self.program))?
            .try_into()?)
    }

    /// Transmits `frame` `count` times.
    pub fn send(&self, frame: &[u8], count: u32) -> Result<()> {
        // struct xdp_md { data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex }: data_end must equal the frame length; the interface is where
        // the frame is injected and so where XDP_TX sends it.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&self.ifindex.to_ne_bytes());
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.ctx_in = Some(&ctx);
        opts.repeat = count;
        opts.attrs = TestRunAttrs::new().xdp_live_frames(LIVE_BATCH);
        // In live mode the kernel reports no verdict: frames are counted where they arrive.
        self.program()?
            .test_run(opts)
            .context("BPF_PROG_TEST_RUN (live frames)")?;
        Ok(())
    }

    /// Sends `plan` on the calling thread: frames in turn, `rate` per second or as fast
    /// as possible, until `count` or `duration`.
    pub fn run(&self, plan: &SendPlan) -> Result<SendReport> {
        if plan.frames.is_empty() {
            bail!("nothing to send: the plan has no frames");
        }
        if let Some(cpu) = plan.cpu {
            pin_to_cpu(cpu)?;
        }
        let start = Instant::now();
        let mut sent = 0u64;
        let mut next = 0usize;
        let mut first: Option<Instant> = None;
        let mut last = start;
        while sent < plan.count && start.elapsed() < plan.duration {
            let want = match plan.rate {
                None => UNPACED_CHUNK,
                Some(rate) => {
                    let due = (start.elapsed().as_secs_f64() * rate as f64) as u64 + 1;
                    if due <= sent {
                        std::thread::sleep(PACE_TICK);
                        continue;
                    }
                    due - sent
                }
            };
            // With several frames, send them in turn, one per call, so their mix holds at
            // every moment; with one frame, the whole chunk in one call.
            let chunk = if plan.frames.len() > 1 { 1 } else { want };
            let chunk = chunk.min(plan.count - sent);
            let now = Instant::now();
            first.get_or_insert(now);
            self.send(&plan.frames[next], chunk as u32)?;
            last = Instant::now();
            sent += chunk;
            next = (next + 1) % plan.frames.len();
        }
        Ok(SendReport {
            sent,
            span: last.duration_since(first.unwrap_or(start)),
        })
    }
}

/// Sends `plan` from the peer end of `pair` (in its namespace) on a thread of its own.
pub fn spawn_live(
    pair: &VethPair,
    plan: SendPlan,
) -> Result<std::thread::JoinHandle<Result<Result<SendReport>>>> {
    let peer = pair.peer.clone();
    spawn_in_netns(&pair.ns, move || -> Result<SendReport> {
        LiveSender::new(ifindex(&peer)?)?.run(&plan)
    })
}

/// Waits for a sender spawned by [`spawn_live`] (or any `spawn_in_netns` sender).
pub fn join_sender(
    handle: std::thread::JoinHandle<Result<Result<SendReport>>>,
) -> Result<SendReport> {
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("sender thread panicked"))??
}
