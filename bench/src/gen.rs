//! Traffic for the end-to-end benchmark: one sender thread per CPU in the peer's
//! namespace, either generator backend, paced or as fast as possible, reporting when the
//! first and the last frame left (absolute instants, so several senders merge).

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use limiter_tests::{
    live::LiveSender,
    netns::{ifindex, spawn_in_netns, VethPair},
    traffic::{pin_to_cpu, PacketSocket, BATCH},
};

/// How frames reach the limited end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_PACKET sendmmsg with qdisc bypass: frames arrive as socket buffers, and veth
    /// copies each into a page before XDP runs.
    AfPacket,
    /// BPF_PROG_TEST_RUN live frames through an XDP_TX program on the peer: frames arrive
    /// as XDP frames, the path a NIC driver gives.
    Live,
    /// The same with a random source in every frame (`traffic_tx_spray`): a flood from
    /// forged sources. Not in [`Backend::ALL`] (a generator, not a path).
    LiveSpray,
    /// The same over a fixed set of sources: the random word masked with this
    /// (`SPRAY_MASK`: 0xFFFF gives 2^16 IPv4 sources and 2^16 IPv6 /64s, 0 one of each),
    /// so that a fixed set costs the generator what a random source does.
    LiveSpraySet(u32),
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::AfPacket, Backend::Live];

    pub fn label(self) -> &'static str {
        match self {
            Backend::AfPacket => "AF_PACKET (skb)",
            Backend::Live => "live frames (XDP frame)",
            Backend::LiveSpray => "live frames, a random source each",
            Backend::LiveSpraySet(_) => "live frames, a source of a fixed set each",
        }
    }
}

/// Unpaced live senders send this many frames per call (one template only): large calls
/// amortise the per-call setup (a page pool).
const LIVE_UNPACED_CHUNK: u64 = 1 << 20;
/// Unpaced live senders with several templates send this many of each per call.
const LIVE_MULTI_CHUNK: u64 = 1 << 16;

/// What to send from every sender.
#[derive(Clone, Debug)]
pub struct Offer {
    pub backend: Backend,
    /// Templates sent in turn.
    pub frames: Vec<Vec<u8>>,
    /// Frames per second per sender; `None` = as fast as possible.
    pub rate_per_sender: Option<u64>,
    /// A paced sender sleeps until this much of its rate is due, then sends it (AF_PACKET
    /// in sendmmsg batches of up to 64, live frames in one call): short lumps make a
    /// smooth offer, long ones cost fewer wake-ups.
    pub lump: Duration,
    pub duration: Duration,
    /// One sender per entry, pinned to that CPU.
    pub cpus: Vec<usize>,
}

/// What the senders sent, merged.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub frames: u64,
    /// The first frame handed to the kernel, by any sender.
    pub first: Instant,
    /// The last frame handed to the kernel, by any sender.
    pub last: Instant,
}

impl Sent {
    pub fn span(&self) -> Duration {
        self.last.saturating_duration_since(self.first)
    }

    fn merge(self, other: Sent) -> Sent {
        Sent {
            frames: self.frames + other.frames,
            first: self.first.min(other.first),
            last: self.last.max(other.last),
        }
    }
}

/// Senders that are running.
pub struct Running {
    handles: Vec<JoinHandle<Result<Result<Sent>>>>,
}

/// Starts one sender per CPU of `offer` in `pair`'s namespace.
pub fn spawn(pair: &VethPair, offer: &Offer) -> Result<Running> {
    ensure!(!offer.frames.is_empty(), "nothing to send: no frames");
    ensure!(!offer.cpus.is_empty(), "nothing to send: no sender CPUs");
    let mut handles = Vec::new();
    for &cpu in &offer.cpus {
        let peer = pair.peer.clone();
        let offer = offer.clone();
        let handle = spawn_in_netns(&pair.ns, move || sender(&peer, cpu, &offer))
            .context("starting a sender in the peer namespace")?;
        handles.push(handle);
    }
    Ok(Running { handles })
}

impl Running {
    /// Waits for every sender; fails if any failed or none sent anything.
    pub fn join(self) -> Result<Sent> {
        let mut merged: Option<Sent> = None;
        let mut failure = None;
        for handle in self.handles {
            let result = handle
                .join()
                .map_err(|_| anyhow::anyhow!("sender thread panicked"))
                .and_then(|r| r)
                .and_then(|r| r);
            match result {
                Ok(sent) => merged = Some(merged.map_or(sent, |m| m.merge(sent))),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            return Err(e.context("a sender failed"));
        }
        let sent = merged.context("no sender ran")?;
        ensure!(sent.frames > 0, "the senders sent nothing");
        Ok(sent)
    }
}

/// One transmit primitive: send `count` frames starting at template `index`.
trait Sink {
    /// Sends up to `count` (fewer if one call takes fewer); returns how many were taken
    /// and which template comes next.
    fn send(&mut self, frames: &[Vec<u8>], index: usize, count: u64) -> Result<(u64, usize)>;
    /// Frames per call when sending as fast as possible.
    fn unpaced_chunk(&self, templates: usize) -> u64;
}

/// Frames to let fall due before sending, when paced at `rate` frames/s.
fn paced_lump(rate: u64, lump: Duration) -> u64 {
    ((rate as f64 * lump.as_secs_f64()) as u64).max(1)
}

struct PacketSink {
    socket: PacketSocket,
}

impl Sink for PacketSink {
    fn send(&mut self, frames: &[Vec<u8>], index: usize, count: u64) -> Result<(u64, usize)> {
        let count = count.min(BATCH as u64) as usize;
        let batch: Vec<&[u8]> = (0..count)
            .map(|i| frames[(index + i) % frames.len()].as_slice())
            .collect();
        let n = self.socket.send_batch(&batch)?;
        Ok((n as u64, (index + n) % frames.len()))
    }

    fn unpaced_chunk(&self, _templates: usize) -> u64 {
        BATCH as u64
    }
}

struct LiveSink {
    sender: LiveSender,
}

impl Sink for LiveSink {
    fn send(&mut self, frames: &[Vec<u8>], index: usize, count: u64) -> Result<(u64, usize)> {
        let count = u32::try_from(count.min(LIVE_UNPACED_CHUNK)).context("live chunk too large")?;
        self.sender.send(&frames[index], count)?;
        Ok((u64::from(count), (index + 1) % frames.len()))
    }

    fn unpaced_chunk(&self, templates: usize) -> u64 {
        if templates == 1 {
            LIVE_UNPACED_CHUNK
        } else {
            // Several templates go in turn, one call each.
            LIVE_MULTI_CHUNK
        }
    }
}

fn sender(peer: &str, cpu: usize, offer: &Offer) -> Result<Sent> {
    pin_to_cpu(cpu).with_context(|| format!("pinning a sender to CPU {cpu}"))?;
    let ifindex = ifindex(peer)?;
    match offer.backend {
        Backend::AfPacket => {
            let socket = PacketSocket::bind(ifindex, false).context("AF_PACKET sender")?;
            send_loop(&mut PacketSink { socket }, offer)
        }
        Backend::Live => {
            let sender = LiveSender::new(ifindex).context("live-frames sender")?;
            send_loop(&mut LiveSink { sender }, offer)
        }
        Backend::LiveSpray => {
            let sender = LiveSender::with_program(ifindex, "traffic_tx_spray")
                .context("live-frames spray sender")?;
            send_loop(&mut LiveSink { sender }, offer)
        }
        Backend::LiveSpraySet(mask) => {
            let sender =
                LiveSender::with_globals(ifindex, "traffic_tx_spray", &[("SPRAY_MASK", mask)])
                    .context("live-frames spray sender over a fixed set")?;
            send_loop(&mut LiveSink { sender }, offer)
        }
    }
}

/// Sends until `offer.duration` has passed, paced or not.
fn send_loop(sink: &mut dyn Sink, offer: &Offer) -> Result<Sent> {
    let lump = match offer.rate_per_sender {
        None => sink.unpaced_chunk(offer.frames.len()),
        Some(0) => bail!("a paced offer of 0 frames/s"),
        Some(rate) => paced_lump(rate, offer.lump),
    };
    let start = Instant::now();
    let mut progress = Progress {
        sent: 0,
        index: 0,
        first: None,
        last: start,
    };
    loop {
        let elapsed = start.elapsed();
        if elapsed >= offer.duration {
            break;
        }
        let want = match offer.rate_per_sender {
            None => lump,
            Some(rate) => {
                // Frames due by now, the first at the start.
                let due = (elapsed.as_secs_f64() * rate as f64) as u64 + 1;
                let behind = due.saturating_sub(progress.sent);
                if behind < lump {
                    // Sleep until a whole lump is due.
                    let at = (progress.sent + lump - 1) as f64 / rate as f64;
                    sleep_until(start + Duration::from_secs_f64(at));
                    continue;
                }
                behind
            }
        };
        progress.send(sink, &offer.frames, want)?;
    }
    Ok(Sent {
        frames: progress.sent,
        first: progress.first.unwrap_or(start),
        last: progress.last,
    })
}

struct Progress {
    sent: u64,
    /// The next template.
    index: usize,
    first: Option<Instant>,
    last: Instant,
}

impl Progress {
    /// Sends `count` frames in as many calls as the sink needs; stops early when a call
    /// takes nothing (the interface is backed up), so the caller can check the clock.
    fn send(&mut self, sink: &mut dyn Sink, frames: &[Vec<u8>], count: u64) -> Result<()> {
        let target = self.sent + count;
        while self.sent < target {
            let (n, next) = sink.send(frames, self.index, target - self.sent)?;
            if n == 0 {
                return Ok(());
            }
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = now;
            self.sent += n;
            self.index = next;
        }
        Ok(())
    }
}

fn sleep_until(when: Instant) {
    let now = Instant::now();
    if when > now {
        std::thread::sleep(when - now);
    }
}
