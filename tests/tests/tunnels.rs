//! Tunnelled traffic end to end: a real `ipip` device on the host end of a veth pair
//! terminates the tunnel, the program on that veth end (native XDP, and the TC build)
//! decapsulates it (`[[tunnels]]`), and a rule on the VIP behind the tunnel meters by the
//! inner header. The peer sends IPIP frames to the host end's address carrying UDP to the
//! VIP; what the host's tunnel device decapsulates and delivers is counted at a UDP
//! socket bound to the VIP. The same over FOU: the IPIP packet inside UDP to a port the
//! host's `ip fou` receives on, as an L4 balancer's FOU tier sends it.
//!
//! This machine's kernel has no tunnel drivers (CONFIG_NET_IPIP, CONFIG_NET_FOU are not
//! set): the tests are `#[ignore]`d on the host, with the reason, and run in the guests
//! of `cargo xtask test --kernel` (Debian's kernels build `ipip` and `fou` as modules),
//! which pass `--include-ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    net::{Ipv4Addr, UdpSocket},
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use limiter_tests::{
    frame::{self, FrameBuilder},
    netns::{ifindex, ip, spawn_in_netns, VethPair},
    scenario::{load_for, PinDir},
    traffic::{send, PacketSocket, SendPlan},
};
use limiter_user::{
    config::{Config, XdpMode},
    daemon::{apply_rules, apply_tunnels},
};

const RATE: u64 = 100;
const BURST: u64 = 20;
const VIP_PORT: u16 = 7000;
const SENT: u64 = 3000;
const SEND_RATE: u64 = 1000;

/// Addresses of one run, in 198.19.N.0/24 with N from the process id: other tests put
/// addresses on host ends in the root namespace at the same time.
struct Addrs {
    /// Outer: the peer (tunnel ingress) and the host end (tunnel egress).
    peer: Ipv4Addr,
    host: Ipv4Addr,
    /// Inner: the VIP (on the tunnel device) and the client behind the ingress.
    vip: Ipv4Addr,
    client: Ipv4Addr,
}

fn addrs() -> Addrs {
    let n = 20 + (std::process::id() % 200) as u8;
    Addrs {
        peer: Ipv4Addr::new(198, 19, n, 1),
        host: Ipv4Addr::new(198, 19, n, 2),
        vip: Ipv4Addr::new(198, 19, n, 10),
        client: Ipv4Addr::new(198, 19, n, 20),
    }
}

/// The host's `ipip` device, removed on drop.
struct IpipDevice {
    name: String,
}

impl Drop for IpipDevice {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

/// How the peer wraps the inner packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encap {
    /// IPv4 in IPv4 (protocol 4).
    Ipip,
    /// The IPIP packet in UDP to the host's FOU port.
    Fou,
}

/// The host's FOU receive port, removed on drop.
struct FouPort(u16);

impl Drop for FouPort {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["fou", "del", "port", &self.0.to_string()])
            .output();
    }
}

/// A FOU port of this run's own (other runs may hold one at the same time).
fn fou_port() -> u16 {
    6000 + (std::process::id() % 1000) as u16
}

/// Sends `SENT` IPIP frames (UDP to the VIP inside) from the peer; returns (rule
/// passed, rule dropped, frames decapsulated by the program, datagrams delivered to the
/// VIP's socket, what the rule admits over the sending time).
fn run(mode: XdpMode, encap: Encap, decapsulate: bool) -> (u64, u64, u64, u64, f64) {
    let a = addrs();
    let pair = VethPair::new(1).expect("creating the veth pair");
    let tunnel = IpipDevice {
        name: format!("ti{}", &pair.host[2..]),
    };
    ip(&["addr", "add", &format!("{}/32", a.host), "dev", &pair.host]).unwrap();
    ip(&["route", "add", &format!("{}/32", a.peer), "dev", &pair.host]).unwrap();
    let port = fou_port().to_string();
    let _fou = match encap {
        Encap::Ipip => None,
        Encap::Fou => {
            // `ip fou` speaks generic netlink, whose families the kernel does not load on
            // demand here (the guest's 6.1 answered ENOENT): the module is loaded first.
            let _ = Command::new("modprobe").arg("fou").output();
            if let Err(e) = ip(&["fou", "add", "port", &port, "ipproto", "4"]) {
                panic!(
                    "adding the host's FOU port: {e:#}: this kernel has no fou driver \
                     (CONFIG_NET_FOU); run in a guest: cargo xtask test --kernel 6.1 tunnels"
                );
            }
            Some(FouPort(fou_port()))
        }
    };
    let (host, peer) = (a.host.to_string(), a.peer.to_string());
    let mut device = vec![
        "link",
        "add",
        tunnel.name.as_str(),
        "type",
        "ipip",
        "local",
        host.as_str(),
        "remote",
        peer.as_str(),
        "dev",
        pair.host.as_str(),
    ];
    if encap == Encap::Fou {
        device.extend([
            "encap",
            "fou",
            "encap-sport",
            "auto",
            "encap-dport",
            port.as_str(),
        ]);
    }
    let made = ip(&device);
    if let Err(e) = made {
        panic!(
            "creating the host's ipip device: {e:#}: this kernel has no ipip driver \
             (CONFIG_NET_IPIP); run in a guest: cargo xtask test --kernel 6.1 tunnels"
        );
    }
    ip(&["link", "set", &tunnel.name, "up"]).unwrap();
    ip(&["addr", "add", &format!("{}/32", a.vip), "dev", &tunnel.name]).unwrap();
    // The reverse-path check finds the client behind the tunnel.
    ip(&[
        "route",
        "add",
        &format!("{}/32", a.client),
        "dev",
        &tunnel.name,
    ])
    .unwrap();

    let pins = PinDir::new();
    let tunnels = if decapsulate {
        let kind = match encap {
            Encap::Ipip => "ipip".to_string(),
            Encap::Fou => format!("fou:{port}"),
        };
        format!(
            "[[tunnels]]\ninterface = \"{}\"\ndecapsulate = [\"{kind}\"]\n",
            pair.host
        )
    } else {
        String::new()
    };
    let config = Config::parse(
        &format!(
            "[[rules]]\nname = \"vip\"\ndst = \"{}/32\"\ndst_port = {VIP_PORT}\nproto = \"udp\"\n\
             rate = {RATE}\nburst = {BURST}\n{tunnels}",
            a.vip
        ),
        Path::new("<tunnels>"),
    )
    .unwrap();
    let mut program = load_for(mode, &pins).unwrap();
    let mut maps = program.maps().unwrap();
    let table = apply_rules(&mut maps, &config).unwrap();
    apply_tunnels(&mut maps, &config).unwrap();
    let slot = table.slots["vip"];
    let attachment = program.attach(&pair.host, mode).expect("attaching");

    let socket = UdpSocket::bind((a.vip, VIP_PORT)).expect("binding the VIP's socket");
    // Room for the whole flood: under a guest's emulation the reader falls behind, and a
    // default-sized buffer dropped 77 of 3000 datagrams the limiter had passed.
    let rcvbuf: libc::c_int = 16 << 20;
    // SAFETY: a valid socket and option value of the size given.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&rcvbuf as *const libc::c_int).cast(),
            std::mem::size_of_val(&rcvbuf) as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let receiver = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let mut got = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if socket.recv(&mut buf).is_ok() {
                    got += 1;
                }
            }
            while socket.recv(&mut buf).is_ok() {
                got += 1;
            }
            got
        })
    };

    let inner = FrameBuilder::ipv4(a.client, a.vip)
        .udp(40000, VIP_PORT)
        .payload_len(64)
        .build();
    let outer = FrameBuilder::ipv4(a.peer, a.host).macs(pair.peer_mac, pair.host_mac);
    let outer = match encap {
        Encap::Ipip => outer.proto(4),
        Encap::Fou => outer.udp(41000, fou_port()),
    }
    .payload(frame::ip_datagram(&inner))
    .build();
    let peer = pair.peer.clone();
    let sender = spawn_in_netns(&pair.ns, move || {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        send(
            &socket,
            &SendPlan {
                frames: vec![outer],
                rate: Some(SEND_RATE),
                count: SENT,
                duration: Duration::from_secs(10),
                cpu: None,
            },
        )
    })
    .unwrap();
    let sent = sender.join().unwrap().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let delivered = receiver.join().unwrap();
    let c = maps.rule_counters(slot).unwrap();
    let decapsulated = maps.tunnel_counters().unwrap().decapsulated;
    program.detach(attachment).unwrap();
    assert_eq!(sent.sent, SENT, "not every frame was sent");
    let admits = RATE as f64 * sent.span.as_secs_f64() + BURST as f64;
    eprintln!(
        "{mode:?}, decapsulate {decapsulate}: {SENT} {encap:?} frames in {:.2}s; rule passed {}, \
         dropped {}; decapsulated {decapsulated}; delivered {delivered}; the rule admits \
         {admits:.0}",
        sent.span.as_secs_f64(),
        c.passed_packets,
        c.dropped_packets
    );
    (
        c.passed_packets,
        c.dropped_packets,
        decapsulated,
        delivered,
        admits,
    )
}

fn inner_header_is_metered(mode: XdpMode, encap: Encap) {
    let (passed, dropped, decapsulated, delivered, admits) = run(mode, encap, true);
    assert_eq!(
        decapsulated, SENT,
        "{mode:?}: every {encap:?} frame is classified by its inner header"
    );
    assert_eq!(
        passed + dropped,
        SENT,
        "{mode:?}: the VIP's rule meters every frame"
    );
    // `admits` is from the sender's span; the frames reach the program over a longer one
    // under a guest's emulation (a run passed 314 where the span admits 312.6): the
    // rule's accuracy is accuracy.rs's, this is that the inner header met it.
    assert!(
        passed as f64 <= admits * 1.02 + 2.0 && passed as f64 >= 0.8 * admits,
        "{mode:?}: the rule passed {passed}, it admits {admits:.0}"
    );
    // What passed is what the tunnel device decapsulated and delivered.
    assert!(
        delivered.abs_diff(passed) <= 1,
        "{mode:?}: delivered {delivered} to the VIP, the rule passed {passed}"
    );
}

/// Without `[[tunnels]]` for the interface, the outer header (to the host's own address)
/// matches no rule: the whole flood reaches the VIP.
fn without_decapsulation_the_flood_passes(mode: XdpMode, encap: Encap) {
    let (passed, dropped, decapsulated, delivered, _) = run(mode, encap, false);
    assert_eq!((passed, dropped, decapsulated), (0, 0, 0), "{mode:?}");
    assert!(
        delivered + 5 >= SENT,
        "{mode:?}: only {delivered} of {SENT} delivered (the host's tunnel works?)"
    );
}

limiter_tests::test_rows! {
    #[ignore = "needs the ipip driver, which this machine's kernel lacks: runs in the guests of `cargo xtask test --kernel`"]
    native_ipip_to_a_vip_is_metered_by_the_inner_header =>
        inner_header_is_metered(XdpMode::Native, Encap::Ipip);
    #[ignore = "needs the ipip driver, which this machine's kernel lacks: runs in the guests of `cargo xtask test --kernel`"]
    tc_ipip_to_a_vip_is_metered_by_the_inner_header =>
        inner_header_is_metered(XdpMode::Tc, Encap::Ipip);
    #[ignore = "needs the ipip driver, which this machine's kernel lacks: runs in the guests of `cargo xtask test --kernel`"]
    native_ipip_without_decapsulation_passes_unmetered =>
        without_decapsulation_the_flood_passes(XdpMode::Native, Encap::Ipip);
    #[ignore = "needs the ipip and fou drivers, which this machine's kernel lacks: runs in the guests of `cargo xtask test --kernel`"]
    native_fou_to_a_vip_is_metered_by_the_inner_header =>
        inner_header_is_metered(XdpMode::Native, Encap::Fou);
    #[ignore = "needs the ipip and fou drivers, which this machine's kernel lacks: runs in the guests of `cargo xtask test --kernel`"]
    native_fou_without_decapsulation_passes_unmetered =>
        without_decapsulation_the_flood_passes(XdpMode::Native, Encap::Fou);
}
