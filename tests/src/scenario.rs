//! Building blocks of end-to-end tests: a bpffs pin directory that removes itself, and
//! "flood a veth pair from its namespace while counting what arrives".

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{
    frame::FrameBuilder,
    netns::{ifindex, spawn_in_netns, VethPair},
    traffic::{send, PacketSocket, ReceiveReport, Receiver, SendPlan, SendReport},
};

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
    let receiver = Receiver::start(pair.host_ifindex()?, |f| is_ipv4_to(f, HOST_V4))?;
    let peer = pair.peer.clone();
    let sender = spawn_in_netns(&pair.ns, move || -> Result<SendReport> {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        send(&socket, &plan)
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
