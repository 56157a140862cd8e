//! Real frames over a veth: an AF_PACKET sender (sendmmsg batches, optional pacing and
//! CPU pinning, bounded in count and time) and a receiver that counts what arrives.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

const ETH_P_ALL: u16 = 0x0003;
/// Frames handed to the kernel per sendmmsg call.
pub const BATCH: usize = 64;

/// An AF_PACKET socket bound to one interface of the calling thread's namespace.
pub struct PacketSocket {
    fd: OwnedFd,
}

fn last_err(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", std::io::Error::last_os_error())
}

impl PacketSocket {
    /// `receive`: also take in every frame the interface receives (ETH_P_ALL); a send-only
    /// socket uses protocol 0 and receives nothing.
    pub fn bind(ifindex: u32, receive: bool) -> Result<PacketSocket> {
        let proto = if receive { ETH_P_ALL.to_be() } else { 0 };
        // Protocol 0 at socket(2): a socket opened with ETH_P_ALL takes in every
        // interface's frames until bind(2) narrows it to one, and other tests flood the
        // same addresses on pairs of their own (`tests/tests/harness.rs`). The protocol
        // is set by the bind, which hooks the socket to `ifindex` alone.
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        if raw < 0 {
            return Err(last_err("socket(AF_PACKET)"));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: addr is a valid sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(last_err("bind(AF_PACKET)"));
        }
        let socket = PacketSocket { fd };
        if !receive {
            // Straight to the driver: no qdisc between the generator and the veth.
            let one: i32 = 1;
            socket.setsockopt(libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one)?;
        }
        Ok(socket)
    }

    fn setsockopt<T>(&self, level: i32, name: i32, value: &T) -> Result<()> {
        // SAFETY: value points to a T of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as u32,
            )
        };
        if rc != 0 {
            return Err(last_err("setsockopt"));
        }
        Ok(())
    }

    /// Takes one frame into `buf` (`flags`: `MSG_DONTWAIT` or 0, then the socket's receive
    /// timeout applies); `None` when none came or a signal interrupted the wait.
    pub fn recv(&self, buf: &mut [u8], flags: i32) -> Result<Option<ReceivedFrame>> {
        // SAFETY: an all-zero sockaddr_ll is valid.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut addr_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: buf and addr are valid for the sizes passed.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                (&raw mut addr).cast(),
                &mut addr_len,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            return match err.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
                _ => bail!("recvfrom: {err}"),
            };
        }
        Ok(Some(ReceivedFrame {
            len: (n as usize).min(buf.len()),
            ifindex: addr.sll_ifindex as u32,
            outgoing: addr.sll_pkttype == libc::PACKET_OUTGOING,
        }))
    }

    /// Sends `frames` with one sendmmsg; returns how many the kernel took.
    pub fn send_batch(&self, frames: &[&[u8]]) -> Result<usize> {
        let mut iovs: Vec<libc::iovec> = frames
            .iter()
            .map(|f| libc::iovec {
                iov_base: f.as_ptr() as *mut _,
                iov_len: f.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero mmsghdr is valid; we fill the iovec fields.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: msgs/iovs outlive the call and describe valid buffers.
        let n =
            unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOBUFS)
                || err.kind() == std::io::ErrorKind::WouldBlock
            {
                return Ok(0);
            }
            bail!("sendmmsg: {err}");
        }
        Ok(n as usize)
    }
}

/// One frame a [`PacketSocket`] took in: its length in the buffer, the interface it came
/// through, and whether it was leaving that interface rather than arriving.
#[derive(Clone, Copy, Debug)]
pub struct ReceivedFrame {
    pub len: usize,
    pub ifindex: u32,
    pub outgoing: bool,
}

/// What to send.
#[derive(Clone, Debug)]
pub struct SendPlan {
    /// Frames sent in turn (a single template, or one per source, tag, case…).
    pub frames: Vec<Vec<u8>>,
    /// Frames per second; `None` sends as fast as the socket takes them.
    pub rate: Option<u64>,
    /// Stop after this many frames…
    pub count: u64,
    /// …or after this long, whichever comes first.
    pub duration: Duration,
    /// Pin the sending thread to this CPU.
    pub cpu: Option<usize>,
}

/// What was sent, and over which span of time.
#[derive(Clone, Copy, Debug)]
pub struct SendReport {
    pub sent: u64,
    /// From the first frame handed to the kernel to the last.
    pub span: Duration,
}

impl SendReport {
    pub fn frames_per_second(&self) -> f64 {
        self.sent as f64 / self.span.as_secs_f64().max(1e-9)
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(last_err("sched_setaffinity"));
    }
    Ok(())
}

/// Sends `plan` through `socket` on the calling thread.
pub fn send(socket: &PacketSocket, plan: &SendPlan) -> Result<SendReport> {
    send_observed(socket, plan, |_, _, _| {})
}

/// [`send`], calling `on_batch(returned_at, first, count)` for every `sendmmsg` that
/// took frames: frames `first..first + count` of the sequence (frame `k` is
/// `plan.frames[k % plan.frames.len()]`).
pub fn send_observed(
    socket: &PacketSocket,
    plan: &SendPlan,
    on_batch: impl FnMut(Instant, u64, usize),
) -> Result<SendReport> {
    send_paced(socket, plan, None, on_batch)
}

/// [`send`] until `stop` is set or the plan runs out, whichever comes first: a test ends
/// traffic it no longer measures instead of waiting for the rest of the plan.
pub fn send_until(socket: &PacketSocket, plan: &SendPlan, stop: &AtomicBool) -> Result<SendReport> {
    send_paced(socket, plan, Some(stop), |_, _, _| {})
}

fn send_paced(
    socket: &PacketSocket,
    plan: &SendPlan,
    stop: Option<&AtomicBool>,
    mut on_batch: impl FnMut(Instant, u64, usize),
) -> Result<SendReport> {
    if plan.frames.is_empty() {
        bail!("nothing to send: the plan has no frames");
    }
    if let Some(cpu) = plan.cpu {
        pin_to_cpu(cpu)?;
    }
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut sent = 0u64;
    let mut next = 0usize;
    let mut batch: Vec<&[u8]> = Vec::with_capacity(BATCH);
    let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
    while sent < plan.count && start.elapsed() < plan.duration && !stopped() {
        let want = (plan.count - sent).min(BATCH as u64) as usize;
        batch.clear();
        for i in 0..want {
            batch.push(&plan.frames[(next + i) % plan.frames.len()]);
        }
        if let Some(rate) = plan.rate {
            // Pace: the (sent+1)-th frame is due at sent/rate after the start.
            let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let n = socket.send_batch(&batch)?;
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            on_batch(now, sent, n);
        }
        sent += n as u64;
        next = (next + n) % plan.frames.len();
    }
    Ok(SendReport {
        sent,
        span: last.duration_since(first.unwrap_or(start)),
    })
}

/// Sends `frames` in turn, one a syscall, as a Poisson process of `rate` frames a second
/// (exponential gaps drawn from `seed`) for `duration`: the arrivals of many independent
/// clients, which a small bucket meets with gaps and clumps, where [`send`]'s paced
/// batches arrive `BATCH` at a time. A sender that falls behind its schedule sends at
/// once, so a late stretch is denser, never thinner, than planned.
pub fn send_poisson(
    socket: &PacketSocket,
    frames: &[Vec<u8>],
    rate: f64,
    duration: Duration,
    seed: u64,
) -> Result<SendReport> {
    send_poisson_until(
        socket,
        frames,
        rate,
        duration,
        seed,
        &AtomicBool::new(false),
    )
}

/// [`send_poisson`] until `stop` is set or `duration` has passed, whichever comes first.
pub fn send_poisson_until(
    socket: &PacketSocket,
    frames: &[Vec<u8>],
    rate: f64,
    duration: Duration,
    seed: u64,
    stop: &AtomicBool,
) -> Result<SendReport> {
    if frames.is_empty() || !rate.is_finite() || rate <= 0.0 {
        bail!("nothing to send: {} frames at {rate}/s", frames.len());
    }
    let mut gaps = PoissonGaps::new(rate, seed);
    let start = Instant::now();
    let mut due = 0.0f64;
    let mut sent = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = start;
    loop {
        due += gaps.next_gap();
        if due >= duration.as_secs_f64() || stop.load(Ordering::Relaxed) {
            break;
        }
        let at = start + Duration::from_secs_f64(due);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let frame = &frames[(sent % frames.len() as u64) as usize];
        if socket.send_batch(&[frame.as_slice()])? == 1 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            sent += 1;
        }
    }
    Ok(SendReport {
        sent,
        span: last.duration_since(first.unwrap_or(start)),
    })
}

/// The gaps of a Poisson process of `rate` events a second, in seconds: exponential, from
/// xorshift64* (a fixed sequence per seed, so a run can be repeated).
pub struct PoissonGaps {
    rate: f64,
    state: u64,
}

impl PoissonGaps {
    pub fn new(rate: f64, seed: u64) -> PoissonGaps {
        PoissonGaps {
            rate,
            state: seed | 1,
        }
    }

    pub fn next_gap(&mut self) -> f64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        // 53 bits in (0, 1]: its logarithm is finite.
        let u = ((self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) + 1) as f64
            / (1u64 << 53) as f64;
        -u.ln() / self.rate
    }
}

/// Counts frames arriving at an interface (after XDP has passed them).
pub struct Receiver {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<ReceiveReport>>>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ReceiveReport {
    /// Frames that matched the filter.
    pub matched: u64,
    /// Frames the socket dropped for lack of buffer (the count is then a lower bound).
    pub socket_drops: u64,
}

impl Receiver {
    /// Starts counting on `ifindex` (calling thread's namespace) the incoming frames for
    /// which `filter` returns true.
    pub fn start(
        ifindex: u32,
        filter: impl Fn(&[u8]) -> bool + Send + 'static,
    ) -> Result<Receiver> {
        let socket = PacketSocket::bind(ifindex, true)?;
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 20_000,
        };
        socket.setsockopt(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
        let buf: i32 = 64 << 20;
        socket.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buf)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let handle =
            std::thread::spawn(move || receive_loop(&socket, ifindex, &stop_flag, &filter));
        Ok(Receiver {
            stop,
            handle: Some(handle),
        })
    }

    /// Waits `settle` for frames in flight, stops, and reports.
    pub fn finish(mut self, settle: Duration) -> Result<ReceiveReport> {
        std::thread::sleep(settle);
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("receiver thread panicked"))?,
            None => bail!("receiver already finished"),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn receive_loop(
    socket: &PacketSocket,
    ifindex: u32,
    stop: &AtomicBool,
    filter: &dyn Fn(&[u8]) -> bool,
) -> Result<ReceiveReport> {
    let mut report = ReceiveReport::default();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let Some(received) = socket.recv(&mut buf, 0)? else {
            continue;
        };
        // The bind admits no other interface's frames; a receiver still counts only its own.
        if received.outgoing || received.ifindex != ifindex {
            continue;
        }
        if filter(&buf[..received.len]) {
            report.matched += 1;
        }
    }
    let mut stats = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as u32;
    // SAFETY: stats is a tpacket_stats of the size passed.
    let rc = unsafe {
        libc::getsockopt(
            socket.fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&raw mut stats).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        report.socket_drops = u64::from(stats.tp_drops);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exponential gaps: mean 1/rate and standard deviation 1/rate (a Poisson process),
    /// not a pacing with jitter; and the same sequence for the same seed.
    #[test]
    fn poisson_gaps_are_exponential() {
        let rate = 1_200.0;
        let n = 200_000;
        let mut gaps = PoissonGaps::new(rate, 7);
        let drawn: Vec<f64> = (0..n).map(|_| gaps.next_gap()).collect();
        let mean = drawn.iter().sum::<f64>() / n as f64;
        let var = drawn.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (mean * rate - 1.0).abs() < 0.01,
            "mean {mean} vs {}",
            1.0 / rate
        );
        assert!((var.sqrt() * rate - 1.0).abs() < 0.02, "sd {}", var.sqrt());
        // P(gap > mean) = e^-1 for an exponential.
        let above = drawn.iter().filter(|&&g| g > 1.0 / rate).count() as f64 / n as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.005, "{above}");
        let mut again = PoissonGaps::new(rate, 7);
        assert!(drawn[..100].iter().all(|&g| g == again.next_gap()));
    }
}
