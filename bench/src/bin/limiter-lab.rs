//! `cargo xtask run` with no arguments: a self-contained lab on this machine. It creates
//! a namespace and a veth pair, runs the real `limiter` daemon on the near end with the
//! repository's example config, sends a mix of well-behaved and abusive traffic from the
//! namespace, and shows a live table of what passes and drops per rule until Ctrl-C
//! (or `--duration SECONDS`). Everything it creates is removed on the way out.
//!
//! In a terminal the live view is `limiter top` on the lab's pins, in the foreground:
//! `q`, Esc or Ctrl-C there ends the lab. Without one (a pipe, the tests) the lab prints
//! its own plain table of totals every second instead.
//!
//! `--lb` (`cargo xtask run -- --lab-lb`): the limiter in front of a stand-in load
//! balancer, as on an LB host whose hook the LB owns. The stand-in (a program that counts
//! what it sees and answers XDP_TX) is pinned, the config names it in `next_program`, and
//! the live view shows its count next to the limiter's: what the limiter passes reaches
//! it, what it drops does not.

use std::{
    io::IsTerminal as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::{
    frame::{with_ipv4_src, FrameBuilder, TCP_ACK, TCP_SYN},
    netns::{ifindex, spawn_in_netns, VethPair},
    traffic::{send, PacketSocket, SendPlan},
};
use limiter_user::{bpf::maps::Maps, observe::stats};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 10);
const PIN_DIR: &str = "/sys/fs/bpf/limiter-lab";
const SOCKET: &str = "/run/limiter-lab/limiter.sock";

/// One traffic source of the lab.
struct Flow {
    what: &'static str,
    frames: Vec<Vec<u8>>,
    rate: u64,
}

fn flows(pair: &VethPair) -> Vec<Flow> {
    let base = |dst: Ipv4Addr| {
        FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 0, 1), dst).macs(pair.peer_mac, pair.host_mac)
    };
    let sources = |template: Vec<u8>, first: u8, n: u8| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut f = template.clone();
                let _ = with_ipv4_src(&mut f, Ipv4Addr::new(198, 19, 1, first + i));
                f
            })
            .collect()
    };
    vec![
        Flow {
            what: "20 clients at 40/s each to :443 (under the per-source 100/s)",
            frames: sources(
                base(VIP).tcp(40000, 443, TCP_ACK).frame_len(128).build(),
                1,
                20,
            ),
            rate: 800,
        },
        Flow {
            what: "one abusive client at 3000/s to :443 (cut to 100/s)",
            frames: sources(
                base(VIP).tcp(40001, 443, TCP_ACK).frame_len(128).build(),
                200,
                1,
            ),
            rate: 3000,
        },
        Flow {
            what: "SYN flood to :80 at 5000/s (connection limit 2000/s)",
            frames: sources(base(VIP).tcp(40002, 80, TCP_SYN).build(), 100, 50),
            rate: 5000,
        },
        Flow {
            what: "established traffic to :80 at 1000/s (not metered by the syn rule)",
            frames: sources(
                base(VIP).tcp(40003, 80, TCP_ACK).frame_len(256).build(),
                150,
                10,
            ),
            rate: 1000,
        },
        Flow {
            what: "1200-byte frames to the /24 at 150,000 B/s (shadow rule at 125,000,000 B/s)",
            frames: sources(
                base(Ipv4Addr::new(198, 18, 10, 77))
                    .udp(5000, 53)
                    .frame_len(1200)
                    .build(),
                50,
                4,
            ),
            rate: 125,
        },
    ]
}

fn lab_config(example: &Path, iface: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(example)
        .with_context(|| format!("reading {}", example.display()))?;
    let text = text
        .replace("interfaces = []", &format!("interfaces = [\"{iface}\"]"))
        .replace("/sys/fs/bpf/limiter\"", &format!("{PIN_DIR}\""))
        .replace("/run/limiter/limiter.sock", SOCKET);
    let path = dir.join("limiter-lab.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The stand-in load balancer, pinned where the config's `next_program` names it.
struct StandinPin {
    lb: limiter_tests::handoff::StandinLb,
    pin: PathBuf,
}

impl StandinPin {
    /// Loads and pins the stand-in, and adds `next_program` to the lab's config.
    fn new(config: &Path) -> Result<StandinPin> {
        let mut lb = limiter_tests::handoff::StandinLb::load()?;
        let pin = PathBuf::from(LB_PIN);
        let _ = std::fs::remove_file(&pin);
        lb.program_mut(limiter_tests::handoff::LB)?
            .pin(&pin)
            .with_context(|| format!("pinning the stand-in LB at {}", pin.display()))?;
        let text = std::fs::read_to_string(config)?;
        std::fs::write(
            config,
            format!("next_program = \"{}\"\n{text}", pin.display()),
        )?;
        println!(
            "lab: stand-in load balancer pinned at {}; the limiter hands it every frame it passes",
            pin.display()
        );
        Ok(StandinPin { lb, pin })
    }
}

impl Drop for StandinPin {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pin);
    }
}

/// Where the lab pins its stand-in load balancer.
const LB_PIN: &str = "/sys/fs/bpf/limiter-lab-standin-lb";

/// The daemon binary next to this one (both live in target/<profile>/).
fn limiter_binary() -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating limiter-lab")?;
    let path = me.with_file_name("limiter");
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p limiter-user` (cargo xtask run does)",
            path.display()
        );
    }
    Ok(path)
}

struct DaemonProcess {
    child: Child,
    binary: PathBuf,
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        // Detach and remove the lab's pins, then make sure the process is gone.
        let _ = Command::new(&self.binary)
            .args(["detach", "--socket", SOCKET, "--pin-dir", PIN_DIR])
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(
            Path::new(SOCKET)
                .parent()
                .unwrap_or(Path::new("/run/limiter-lab")),
        );
    }
}

/// Runs `limiter top` on the lab's pins with the terminal until it exits (`q`, Esc,
/// Ctrl-C), the lab is signalled (SIGINT, SIGTERM) or `duration` is over; then the lab
/// goes on to its final table and cleanup. SIGTERM lets top give the terminal back.
fn top_in_the_foreground(binary: &Path, duration: Option<Duration>) -> Result<()> {
    let mut top = Command::new(binary)
        .args(["top", "--pin-dir", PIN_DIR])
        .spawn()
        .context("starting limiter top")?;
    let started = Instant::now();
    loop {
        if let Some(status) = top.try_wait().context("waiting for limiter top")? {
            if !status.success() {
                println!("lab: limiter top exited with {status}");
            }
            return Ok(());
        }
        if STOP.load(Ordering::Relaxed) || duration.is_some_and(|d| started.elapsed() >= d) {
            // SAFETY: signalling the child this lab started, by its id.
            unsafe { libc::kill(top.id() as libc::pid_t, libc::SIGTERM) };
            let _ = top.wait();
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The lab's flags: `--duration SECONDS` and `--lb`; anything else is refused by name
/// before anything is created.
fn flags() -> Result<(Option<Duration>, bool)> {
    let mut duration = None;
    let mut lb = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--duration" => {
                let s = args.next().context("--duration needs SECONDS")?;
                let secs = s.parse().with_context(|| {
                    format!("--duration SECONDS: not a number of seconds: {s:?}")
                })?;
                duration = Some(Duration::from_secs(secs));
            }
            "--lb" => lb = true,
            other => bail!(
                "limiter-lab: unknown argument {other:?} (it takes --duration SECONDS and --lb)"
            ),
        }
    }
    Ok((duration, lb))
}

fn main() -> Result<()> {
    let (duration, with_lb) = flags()?;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_path_buf();
    let binary = limiter_binary()?;
    let pair = VethPair::new(1).context("creating the lab's namespace and veth pair")?;
    let dir = std::env::temp_dir().join(format!("limiter-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = lab_config(&root.join("limiter.example.toml"), &pair.host, &dir)?;
    let lb = if with_lb {
        Some(StandinPin::new(&config)?)
    } else {
        None
    };
    println!(
        "lab: namespace {} with {} -> {} (limited end)",
        pair.ns, pair.peer, pair.host
    );
    println!("lab: config {}", config.display());
    let child = Command::new(&binary)
        .args(["run", "--config"])
        .arg(&config)
        .stderr(std::fs::File::create(dir.join("daemon.log"))?)
        .spawn()
        .context("starting limiter run")?;
    let daemon = DaemonProcess {
        child,
        binary: binary.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Command::new(&binary)
        .args(["status", "--socket", SOCKET])
        .output()?
        .status
        .success()
    {
        if Instant::now() > deadline {
            bail!(
                "the daemon did not come up; see {}",
                dir.join("daemon.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let running = Arc::new(AtomicBool::new(true));
    let mut senders = Vec::new();
    for flow in flows(&pair) {
        println!("lab: sending {}", flow.what);
        let (peer, running) = (pair.peer.clone(), Arc::clone(&running));
        senders.push(spawn_in_netns(&pair.ns, move || -> Result<()> {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            let plan = SendPlan {
                frames: flow.frames,
                rate: Some(flow.rate),
                count: flow.rate,
                duration: Duration::from_secs(1),
                cpu: None,
            };
            while running.load(Ordering::Relaxed) {
                send(&socket, &plan)?;
            }
            Ok(())
        })?);
    }
    println!("lab: try `{} status --socket {SOCKET}` or `... explain --src 198.19.1.200 --dst {VIP}:443 --socket {SOCKET}` in another terminal; Ctrl-C to stop", binary.display());
    std::thread::sleep(Duration::from_secs(2));

    let maps = Maps::from_pins(Path::new(PIN_DIR))?;
    let started = Instant::now();
    let in_terminal = std::io::stdout().is_terminal();
    if in_terminal {
        top_in_the_foreground(&binary, duration)?;
    }
    while !in_terminal
        && !STOP.load(Ordering::Relaxed)
        && duration.is_none_or(|d| started.elapsed() < d)
    {
        let report = stats::collect(&maps)?;
        // Not a terminal (a pipe, a log): one table after another, no screen control.
        println!(
            "\n--- limiter lab — {} s — Ctrl-C to stop (counters are totals)\n",
            started.elapsed().as_secs()
        );
        print!("{}", stats::render_table(&report));
        if let Some(lb) = &lb {
            println!(
                "\nstand-in load balancer (next_program = \"{}\"): saw {} frames, all answered \
                 XDP_TX; the limiter handed it everything it passed ({} frames found no next \
                 program)",
                lb.pin.display(),
                lb.lb.seen(limiter_tests::handoff::LB)?,
                report.global.handoff_missing
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    running.store(false, Ordering::Relaxed);
    for s in senders {
        let _ = s.join();
    }
    let report = stats::collect(&maps)?;
    println!("\nfinal:\n{}", stats::render_table(&report));
    if let Some(lb) = &lb {
        let passed: u64 = report.rules.iter().map(|r| r.counters.passed_packets).sum();
        println!(
            "stand-in load balancer: saw {} frames; the limiter passed {passed} frames of its \
             rules (the rest it passed: unmatched, non-IP)",
            lb.lb.seen(limiter_tests::handoff::LB)?
        );
    }
    drop(maps);
    drop(daemon);
    drop(lb);
    drop(pair);
    let _ = std::fs::remove_dir_all(&dir);
    println!("lab: cleaned up (namespace, veth, pins, socket)");
    Ok(())
}
