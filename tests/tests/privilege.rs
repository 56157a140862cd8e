//! Least privilege, tested: the daemon runs and enforces with exactly the capabilities
//! dist/limiter.service grants (read from the unit itself, so the unit cannot drift from
//! what is tested), under `setpriv` with every other capability out of the bounding set,
//! as systemd's CapabilityBoundingSet= does for root. Without any one of them it refuses
//! to start, names the capability, and changes nothing. Every exclusive mode restarts
//! over its own attachment with them (the kernel's answer differs by version: tcx links
//! on 6.6+, cls_bpf filters on Debian 12's 6.1, so the guests run this file too);
//! `xdp_share = "libxdp"` needs CAP_SYS_ADMIN besides. `limiter stats` needs none as
//! root; a user who is not root gets an error that says so, not a raw EPERM.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use common::{Daemon, Lab, LIMITER};
use limiter_tests::{scenario::udp_to_host, traffic::SendPlan};

const RULES: &str =
    "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = 100\nburst = 10\n";

/// The values of `key=` in the unit's [Service] section, space-separated, all lines.
fn unit_list(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .flat_map(|v| v.split_whitespace().map(str::to_string))
        .collect()
}

/// The capabilities dist/limiter.service grants, as setpriv names them (`bpf`, ...).
fn unit_capabilities() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/limiter.service");
    let unit = std::fs::read_to_string(&path).expect("reading dist/limiter.service");
    let bounding = unit_list(&unit, "CapabilityBoundingSet");
    assert!(
        !bounding.is_empty(),
        "{} has no CapabilityBoundingSet=",
        path.display()
    );
    assert_eq!(
        unit_list(&unit, "AmbientCapabilities"),
        bounding,
        "the unit's ambient set differs from its bounding set"
    );
    bounding
        .iter()
        .map(|c| {
            c.strip_prefix("CAP_")
                .unwrap_or_else(|| panic!("{c} is not a capability name"))
                .to_ascii_lowercase()
        })
        .collect()
}

/// `setpriv` prefix: no inheritable capabilities and a bounding set of exactly `caps`.
/// Root then holds exactly `caps` after exec, as under systemd's CapabilityBoundingSet=.
fn setpriv(caps: &[String]) -> Command {
    let mut bounding = String::from("-all");
    for c in caps {
        bounding.push_str(",+");
        bounding.push_str(c);
    }
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--inh-caps=-all",
        &format!("--bounding-set={bounding}"),
        "--",
    ]);
    cmd
}

fn spawn_run(lab: &Lab, caps: &[String]) -> Daemon {
    let child = setpriv(caps)
        .arg(LIMITER.path())
        .args(["run", "--config"])
        .arg(&lab.config)
        .spawn()
        .expect("running setpriv (util-linux) with limiter run");
    Daemon(child)
}

/// `limiter run` with `caps`, waited for: for starts that must be refused.
fn run_to_the_end(lab: &Lab, caps: &[String]) -> Output {
    setpriv(caps)
        .arg(LIMITER.path())
        .args(["run", "--config"])
        .arg(&lab.config)
        .stderr(Stdio::piped())
        .output()
        .expect("running setpriv (util-linux) with limiter run")
}

fn stats_with(lab: &Lab, caps: &[String]) -> Output {
    setpriv(caps)
        .arg(LIMITER.path())
        .args(["stats", "--json", "--pin-dir"])
        .arg(&lab.pins.path)
        .output()
        .expect("running setpriv (util-linux) with limiter stats")
}

fn effective_caps(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff in /proc/PID/status");
    u64::from_str_radix(mask.trim(), 16).unwrap()
}

#[test]
fn the_units_capabilities_are_enough_to_enforce() {
    let caps = unit_capabilities();
    let lab = Lab::new(RULES);
    let daemon = spawn_run(&lab, &caps);
    lab.wait_ready();
    // The daemon holds what the unit grants and nothing else (CAP_SYS_ADMIN is bit 21).
    let eff = effective_caps(daemon.pid());
    assert_eq!(
        eff.count_ones() as usize,
        caps.len(),
        "effective set {eff:#x} is not the unit's {caps:?}"
    );
    assert_eq!(eff & (1 << 21), 0, "the daemon holds CAP_SYS_ADMIN");

    let (sent, _) = limiter_tests::scenario::flood(
        &lab.pair,
        SendPlan {
            frames: vec![udp_to_host(&lab.pair, 9, 64)],
            rate: Some(2000),
            count: 1000,
            duration: Duration::from_secs(3),
            cpu: None,
        },
    )
    .unwrap();
    assert!(sent.sent >= 500, "sent only {} frames", sent.sent);

    // `stats` reads the pins with the unit's capabilities, and with none at all (root).
    for with in [caps.clone(), Vec::new()] {
        let (passed, dropped) = rule_counters(&lab, &with);
        assert!(
            dropped > 0 && passed < sent.sent,
            "nothing dropped over the limit: passed {passed}, dropped {dropped} of {}",
            sent.sent
        );
    }
    daemon.stop();
}

/// A flood of 600 frames over the rule's limit through the running daemon: something
/// passes and something is dropped (the counters are read with the unit's capabilities).
fn enforces(lab: &Lab, caps: &[String], what: &str) {
    let before = rule_counters(lab, caps);
    let (sent, _) = limiter_tests::scenario::flood(
        &lab.pair,
        SendPlan {
            frames: vec![udp_to_host(&lab.pair, 9, 64)],
            rate: Some(2000),
            count: 600,
            duration: Duration::from_secs(3),
            cpu: None,
        },
    )
    .unwrap();
    let after = rule_counters(lab, caps);
    let (passed, dropped) = (after.0 - before.0, after.1 - before.1);
    assert!(
        sent.sent >= 300 && passed > 0 && dropped > 0,
        "{what}: passed {passed}, dropped {dropped} of {} sent",
        sent.sent
    );
}

/// (passed, dropped) packets of rule `web`, from `limiter stats` run with `caps`.
fn rule_counters(lab: &Lab, caps: &[String]) -> (u64, u64) {
    let out = stats_with(lab, caps);
    assert!(
        out.status.success(),
        "limiter stats with {caps:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let web = stats["rules"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "web"))
        .cloned()
        .unwrap_or_else(|| panic!("no rule web in {stats}"));
    let count = |key: &str| web[key].as_u64().unwrap_or(0);
    (count("passed_packets"), count("dropped_packets"))
}

/// Starts `limiter run` with `caps` and waits until it serves, or panics with what it
/// logged when it exited instead (its log goes to a file of the lab's directory).
fn start_with(lab: &Lab, caps: &[String], what: &str) -> Daemon {
    let log_path = lab.dir.path().join("run.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = setpriv(caps)
        .arg(LIMITER.path())
        .args(["run", "--config"])
        .arg(&lab.config)
        .stderr(log)
        .spawn()
        .expect("running setpriv (util-linux) with limiter run");
    let limit = if limiter_tests::in_guest() { 120 } else { 20 };
    let deadline = std::time::Instant::now() + Duration::from_secs(limit);
    while !lab.limiter(&["status", "--json"]).status.success() {
        if let Some(status) = child.try_wait().unwrap() {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("{what}: limiter run exited ({status}) with {caps:?}: {said}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not serving after {limit} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Daemon(child)
}

/// The `prog_<id>` pins of the lab's pin directory.
fn program_pins(lab: &Lab) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(&lab.pins.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("prog_"))
        .collect();
    names.sort();
    names
}

/// `mode` started, killed with SIGKILL (nothing cleaned up) and started again over what
/// the first daemon left attached and pinned, each time with only the unit's
/// capabilities: the restart must recognise the limiter's own attachment (a link, a tc
/// filter) without CAP_SYS_ADMIN, which the kernel requires for opening a program by its
/// id. One test per mode, so that CI's 6.1 guest runs the kernel paths that differ
/// (an XDP bpf_link and a cls_bpf filter) without a third pair of emulated starts: native
/// and generic links are created, read back and replaced by the same kernel code, with
/// the same capability checks (the mode is a flag of the link).
fn starts_and_restarts_over_its_own_attachment(mode: &'static str) {
    let caps = unit_capabilities();
    let lab = Lab::with_mode(RULES, mode);
    let first = start_with(&lab, &caps, &format!("{mode}: first start"));
    enforces(&lab, &caps, &format!("{mode}: first daemon"));
    let first_programs = program_pins(&lab);
    assert!(!first_programs.is_empty(), "{mode}: no program pinned");
    first.kill9();
    let second = start_with(&lab, &caps, &format!("{mode}: restart after kill -9"));
    enforces(&lab, &caps, &format!("{mode}: restarted daemon"));
    // The restarted daemon's programs replace the first one's pins, none kept.
    let second_programs = program_pins(&lab);
    assert_eq!(
        second_programs.len(),
        first_programs.len(),
        "{mode}: program pins {first_programs:?} then {second_programs:?}"
    );
    assert!(
        second_programs.iter().all(|p| !first_programs.contains(p)),
        "{mode}: the first daemon's programs stay pinned: {second_programs:?}"
    );
    second.stop();
}

#[test]
fn native_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities() {
    starts_and_restarts_over_its_own_attachment("native");
}

#[test]
fn generic_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities() {
    starts_and_restarts_over_its_own_attachment("generic");
}

#[test]
fn tc_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities() {
    starts_and_restarts_over_its_own_attachment("tc");
}

/// `xdp_share = "libxdp"` reads the dispatcher on the hook by its program id, which the
/// kernel opens only for CAP_SYS_ADMIN: with the unit's capabilities alone the daemon
/// refuses to start, names CAP_SYS_ADMIN and changes nothing (checked before anything
/// is loaded, so this runs on any kernel).
#[test]
fn libxdp_sharing_without_cap_sys_admin_is_refused_naming_it() {
    let caps = unit_capabilities();
    let lab = Lab::with_settings(RULES, "native", "xdp_share = \"libxdp\"");
    let out = run_to_the_end(&lab, &caps);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started libxdp sharing without CAP_SYS_ADMIN"
    );
    assert!(
        err.contains("xdp_share = \"libxdp\" needs CAP_SYS_ADMIN"),
        "the error does not name CAP_SYS_ADMIN: {err}"
    );
    assert!(
        lab.attached_program().is_none(),
        "attached without CAP_SYS_ADMIN"
    );
    assert!(
        !lab.pins.path.exists(),
        "pinned something without CAP_SYS_ADMIN"
    );
}

/// With CAP_SYS_ADMIN added to the unit's capabilities (the README's drop-in), libxdp
/// sharing works: installing the limiter's own dispatcher on an empty hook, restarting
/// over it after kill -9, and joining the dispatcher xdp-filter (libxdp) installed.
#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn libxdp_sharing_with_the_units_capabilities_and_cap_sys_admin() {
    assert!(
        limiter_tests::in_guest(),
        "libxdp's dispatcher needs freplace: run with `cargo xtask test --kernel 6.1 -- privilege`"
    );
    let mut caps = unit_capabilities();
    caps.push("sys_admin".to_string());
    let _state = limiter_tests::xdp_tools::LibxdpState::new();
    {
        let lab = Lab::with_settings(RULES, "native", "xdp_share = \"libxdp\"");
        let first = start_with(&lab, &caps, "libxdp: first start on an empty hook");
        enforces(&lab, &caps, "libxdp: first daemon");
        first.kill9();
        let second = start_with(&lab, &caps, "libxdp: restart over its own dispatcher");
        enforces(&lab, &caps, "libxdp: restarted daemon");
        second.stop();
    }
    let lab = Lab::with_settings(RULES, "native", "xdp_share = \"libxdp\"");
    let _filter = limiter_tests::xdp_tools::XdpFilter::load(&lab.pair.host, 7);
    let joined = start_with(&lab, &caps, "libxdp: joining xdp-filter's dispatcher");
    enforces(&lab, &caps, "libxdp: joined daemon");
    joined.stop();
}

#[test]
fn without_any_one_of_them_start_fails_naming_it_and_changes_nothing() {
    let caps = unit_capabilities();
    for missing in &caps {
        let lab = Lab::new(RULES);
        let rest: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let out = run_to_the_end(&lab, &rest);
        let err = String::from_utf8_lossy(&out.stderr);
        let name = format!("CAP_{}", missing.to_ascii_uppercase());
        assert!(!out.status.success(), "started without {name}");
        assert!(
            err.contains(&format!("needs {name}")),
            "the error does not name {name}: {err}"
        );
        assert!(
            !err.contains("os error"),
            "a raw errno without {name}: {err}"
        );
        assert!(lab.attached_program().is_none(), "attached without {name}");
        assert!(
            !lab.pins.path.exists(),
            "pinned something without {name}: {}",
            lab.pins.path.display()
        );
        assert!(!lab.socket.exists(), "left a control socket without {name}");
    }
}

#[test]
fn a_user_who_is_not_root_is_told_so() {
    let lab = Lab::new(RULES);
    let daemon = lab.start();
    let nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .arg(LIMITER.path())
            .args(args)
            .output()
            .expect("running setpriv (util-linux)")
    };
    let pins = lab.pins.path.display().to_string();
    let socket = lab.socket.display().to_string();
    for (args, says) in [
        (vec!["stats", "--pin-dir", &pins], "belongs to root"),
        (vec!["status", "--socket", &socket], "for root only"),
    ] {
        let out = nobody(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "limiter {args:?} succeeded as nobody"
        );
        assert!(
            err.contains("permission denied") && err.contains(says),
            "limiter {args:?} as nobody: {err}"
        );
        assert!(!err.contains("os error"), "a raw errno: {err}");
    }
    daemon.stop();
}

/// `systemd-analyze verify` accepts both units, in a root of their own where
/// /usr/bin holds the binaries just built (the units name the packaged paths).
#[test]
fn systemd_analyze_verify_accepts_both_units() {
    let root = tempfile::tempdir().unwrap();
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist");
    let units = root.path().join("etc/systemd/system");
    let bin = root.path().join("usr/bin");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    // systemd's own units (sysinit.target, ...), which every service depends on.
    for system in ["lib/systemd/system", "usr/lib/systemd/system"] {
        let from = Path::new("/").join(system);
        if from.is_dir() {
            let to = root.path().join(system);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let copied = Command::new("cp")
                .arg("-a")
                .arg(&from)
                .arg(&to)
                .status()
                .unwrap();
            assert!(copied.success(), "copying {}", from.display());
        }
    }
    for name in ["limiter.service", "limiter-allocator.service"] {
        std::fs::copy(dist.join(name), units.join(name)).unwrap();
    }
    std::fs::copy(LIMITER.path(), bin.join("limiter")).unwrap();
    std::fs::copy(
        limiter_tests::binaries::LIMITER_ALLOCATOR.path(),
        bin.join("limiter-allocator"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.path().display()))
        .args(["limiter.service", "limiter-allocator.service"])
        .output()
        .expect("running systemd-analyze (Debian package systemd)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// Fleet mode with the same capabilities: the daemon reports to an allocator that runs
/// with no capability at all (as dist/limiter-allocator.service has it) and gets a lease.
#[test]
fn fleet_mode_needs_nothing_more_and_the_allocator_nothing_at_all() {
    let caps = unit_capabilities();
    let dir = tempfile::tempdir().unwrap();
    let pki = common::pki::Pki::new(dir.path());
    let port = common::free_port();
    let server = pki.pair("allocator");
    let config = dir.path().join("allocator.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics = \"\"\ncontrol_socket = \"{}\"\n\
             lease_ttl_ms = 1500\nreport_interval_ms = 300\n\
             [tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             [[quotas]]\nrule = \"web\"\nrate = 1000\nburst = 100\n",
            dir.path().join("run/allocator.sock").display(),
            pki.ca().display(),
            server.cert.display(),
            server.key.display()
        ),
    )
    .unwrap();
    let allocator = Daemon(
        setpriv(&[])
            .arg(limiter_tests::binaries::LIMITER_ALLOCATOR.path())
            .args(["run", "--config"])
            .arg(&config)
            .spawn()
            .expect("running setpriv (util-linux) with limiter-allocator run"),
    );
    // Serving (setpriv has exec'd it) before its capabilities are read.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the allocator did not listen without capabilities"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        effective_caps(allocator.pid()),
        0,
        "the allocator holds capabilities"
    );
    let host = pki.pair("lb-1");
    let lab = Lab::new(&format!(
        "fleet_size = 1\n\
         [[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 1000\nburst = 100\n\
         [fleet]\nallocator = \"127.0.0.1:{port}\"\nhost_id = \"lb-1\"\nca = \"{}\"\ncert = \"{}\"\n\
         key = \"{}\"\nlease_ttl_ms = 1500\nreport_interval_ms = 300\n",
        pki.ca().display(),
        host.cert.display(),
        host.key.display()
    ));
    let daemon = spawn_run(&lab, &caps);
    lab.wait_ready();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let state = lab.rule_stats("web")["state"].clone();
        if state == "leased" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no lease with the unit's capabilities: web is {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon.stop();
    allocator.stop();
}
