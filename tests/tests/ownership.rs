//! The limiter touches only what it created, and shows what it runs: the control
//! sockets of the daemon and the allocator (an existing directory keeps its mode, a file
//! or a live socket in the way is refused, one instance per socket), pins under
//! `pin_dir` (cleanup leaves another's, a foreign object under a limiter name is never
//! replaced), links of interfaces dropped from the config (detached at start), per-source
//! buckets of a reassigned rule slot (cleared), and the bypass flag (shown). Real
//! binaries, real program on veth ends, real frames.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    collections::BTreeSet,
    net::{TcpListener, TcpStream},
    os::unix::{
        fs::PermissionsExt as _,
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

use common::{join, pki::Pki, Lab, LIMITER};
use limiter_common::abi::{Control, SourceKey, CONTROL_BYPASS};
use limiter_tests::{
    netns::VethPair,
    scenario::{flood, udp_to_host, PEER_V4},
    traffic::SendPlan,
};
use limiter_user::bpf::maps::Maps;

const RULE: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 10\nburst = 10\n";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Whether XDP is off `iface` within a second: the kernel releases a link whose pin and
/// last descriptor are gone asynchronously.
fn xdp_detached_soon(iface: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    while xdp_attached(iface) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn xdp_attached(iface: &str) -> bool {
    let out = Command::new("ip")
        .args(["-d", "link", "show", "dev", iface])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

#[test]
fn daemon_socket_in_an_existing_directory_leaves_its_mode() {
    let mut lab = Lab::new(RULE);
    let shared = lab.dir.path().join("shared-run");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    lab.socket = shared.join("limiter.sock");
    lab.write_config(RULE);
    let daemon = lab.start();
    assert_eq!(
        mode(&shared),
        0o755,
        "the daemon changed an existing directory"
    );
    assert_eq!(mode(&lab.socket), 0o600);
    daemon.stop();
    assert!(!lab.socket.exists(), "the socket outlived the daemon");
    assert_eq!(mode(&shared), 0o755);
}

#[test]
fn daemon_refuses_a_file_at_its_socket_path_and_changes_nothing() {
    let lab = Lab::new(RULE);
    std::fs::create_dir_all(lab.socket.parent().unwrap()).unwrap();
    std::fs::write(&lab.socket, "not a socket").unwrap();
    let err = lab.run_must_fail();
    assert!(
        err.contains(&format!("{} is in the way", lab.socket.display()))
            && err.contains("a regular file"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&lab.socket).unwrap(),
        "not a socket"
    );
    assert!(!xdp_attached(&lab.pair.host), "attached although refused");
    assert!(!lab.pins.path.exists(), "pinned although refused");
}

#[test]
fn daemon_refuses_a_live_socket_and_a_second_daemon() {
    let lab = Lab::new(RULE);
    std::fs::create_dir_all(lab.socket.parent().unwrap()).unwrap();
    // Someone else serves at the path (no limiter lock held).
    let foreign = UnixListener::bind(&lab.socket).unwrap();
    let err = lab.run_must_fail();
    assert!(
        err.contains(&format!("{} is live", lab.socket.display())),
        "{err}"
    );
    assert!(
        UnixStream::connect(&lab.socket).is_ok(),
        "the live socket was taken over"
    );
    drop(foreign);

    // A dead socket (the foreign server exited) is replaced; then a second daemon on
    // the same socket is refused, naming the first one's pid.
    let daemon = lab.start();
    let err = lab.run_must_fail();
    assert!(
        err.contains("another limiter daemon is running")
            && err.contains(&format!("pid {}", daemon.pid())),
        "{err}"
    );
    // The first is untouched and still answers.
    assert_eq!(lab.json(&["status", "--json"])["pid"], daemon.pid());
    daemon.stop();
}

struct Allocator {
    child: Child,
}

impl Drop for Allocator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn allocator_binary() -> PathBuf {
    let path = Path::new(LIMITER).with_file_name("limiter-allocator");
    assert!(
        path.exists(),
        "{} is missing: build it (cargo build --release -p limiter-allocator)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn allocator_config(dir: &Path, pki: &Pki, name: &str, socket: &Path) -> (PathBuf, u16) {
    let port = free_port();
    let server = pki.pair("allocator");
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics = \"\"\ncontrol_socket = \"{}\"\n\
             [tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             [[quotas]]\nrule = \"{name}\"\nrate = 100\nburst = 10\n",
            socket.display(),
            pki.ca().display(),
            server.cert.display(),
            server.key.display()
        ),
    )
    .unwrap();
    (config, port)
}

fn allocator_run(config: &Path) -> Command {
    let mut cmd = Command::new(allocator_binary());
    cmd.args(["run", "--config"]).arg(config);
    cmd
}

/// Runs an allocator that must refuse to start (killed, and the test failed, if it runs
/// on); returns its stderr.
fn allocator_refused(config: &Path) -> String {
    let mut child = allocator_run(config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!status.success(), "the allocator succeeded: {err}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the allocator did not refuse to start: it is running");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn quota_list(socket: &Path) -> Output {
    Command::new(allocator_binary())
        .args(["quota", "list", "--socket"])
        .arg(socket)
        .output()
        .unwrap()
}

#[test]
fn allocator_is_single_and_leaves_what_is_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shared = dir.path().join("shared-run");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = shared.join("allocator.sock");

    let (first_config, port) = allocator_config(dir.path(), &pki, "first", &socket);
    let _first = Allocator {
        child: allocator_run(&first_config).spawn().unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the allocator did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        mode(&shared),
        0o755,
        "the allocator changed an existing directory"
    );

    // A second allocator on the same socket (another gRPC port): refused, and the first
    // keeps its socket.
    let (second_config, _) = allocator_config(dir.path(), &pki, "second", &socket);
    let err = allocator_refused(&second_config);
    assert!(
        err.contains("another limiter-allocator is running"),
        "{err}"
    );
    let listed = quota_list(&socket);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && text.contains("first") && !text.contains("second"),
        "the first allocator lost its socket: {text} {}",
        String::from_utf8_lossy(&listed.stderr)
    );

    // A file where the socket should be: refused, naming it; the file stays.
    let file = shared.join("file.sock");
    std::fs::write(&file, "keep").unwrap();
    let (third_config, _) = allocator_config(dir.path(), &pki, "third", &file);
    let err = allocator_refused(&third_config);
    assert!(
        err.contains(&format!("{} is in the way", file.display()))
            && err.contains("a regular file"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

/// Pins a map of someone else's with bpftool.
fn foreign_map(path: &Path, name: &str) {
    foreign_map_of(path, name, 4);
}

/// The same with values of `value_size` bytes (8: the layout of the limiter's CONTROL).
fn foreign_map_of(path: &Path, name: &str, value_size: u32) {
    let value_size = value_size.to_string();
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(path)
        .args([
            "type",
            "array",
            "key",
            "4",
            "value",
            &value_size,
            "entries",
            "1",
            "name",
            name,
        ])
        .output()
        .expect("bpftool (apt-get install bpftool)");
    assert!(
        out.status.success(),
        "bpftool map create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn detach_removes_only_the_limiters_pins() {
    let lab = Lab::new(RULE);
    // An existing pin directory keeps its mode.
    std::fs::create_dir(&lab.pins.path).unwrap();
    std::fs::set_permissions(&lab.pins.path, std::fs::Permissions::from_mode(0o750)).unwrap();
    let daemon = lab.start();
    assert_eq!(
        mode(&lab.pins.path),
        0o750,
        "the daemon changed the pin directory"
    );
    // Another tool's pins beside the limiter's, one under a name of the limiter's form.
    foreign_map(&lab.pins.path.join("other_tool_map"), "other_tool_map");
    foreign_map(&lab.pins.path.join("link_bogus0"), "not_a_link");
    foreign_map(&lab.pins.path.join("prog_7"), "not_a_prog");
    let foreign = ["link_bogus0", "other_tool_map", "prog_7"];
    let ours: BTreeSet<String> = names_in(&lab.pins.path)
        .into_iter()
        .filter(|n| !foreign.contains(&n.as_str()))
        .collect();
    assert!(ours.contains("CONTROL") && ours.contains(&format!("link_{}", lab.pair.host)));
    // The programs the daemon runs are pinned, so a restart knows its own link.
    assert!(ours.iter().any(|n| n.starts_with("prog_")), "{ours:?}");

    // Through the daemon.
    let out = lab.limiter(&["detach"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    drop(daemon);
    assert!(
        xdp_detached_soon(&lab.pair.host),
        "still attached after detach"
    );
    assert_eq!(
        names_in(&lab.pins.path),
        foreign
            .iter()
            .map(|n| n.to_string())
            .collect::<BTreeSet<_>>(),
        "detach removed pins it did not create, or left its own"
    );
    assert!(
        err.contains("other_tool_map in place")
            && err.contains("link_bogus0 in place: a pinned map, not the limiter's link")
            && err.contains("prog_7 in place: a pinned map, not the limiter's program"),
        "{err}"
    );

    // Without a daemon: the same.
    lab.start().kill9();
    let out = lab.limiter(&["detach"]);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    assert!(
        text.contains("removed") && text.contains("CONTROL"),
        "{text}"
    );
    assert!(err.contains("other_tool_map in place"), "{err}");
    assert_eq!(names_in(&lab.pins.path).len(), foreign.len(), "{text}");
}

#[test]
fn a_foreign_object_at_a_link_pin_is_refused_not_replaced() {
    let lab = Lab::new(RULE);
    std::fs::create_dir(&lab.pins.path).unwrap();
    let pin = lab.pins.path.join(format!("link_{}", lab.pair.host));
    foreign_map(&pin, "someone_elses");
    let err = lab.run_must_fail();
    assert!(
        err.contains(&format!("{} is in the way", pin.display())) && err.contains("a pinned map"),
        "{err}"
    );
    assert!(pin.exists(), "the foreign pin was removed");
    assert!(!xdp_attached(&lab.pair.host));
    std::fs::remove_file(&pin).unwrap();

    // Another's map at a map name of the limiter's, even of the same layout, is not
    // adopted: the program would run on it.
    let control = lab.pins.path.join("CONTROL");
    foreign_map_of(&control, "someones_ctl", 8);
    let err = lab.run_must_fail();
    assert!(
        err.contains(&format!("{} is in the way", control.display()))
            && err.contains("a map named \"someones_ctl\", not the limiter's CONTROL"),
        "{err}"
    );
    assert!(!xdp_attached(&lab.pair.host));
}

#[test]
fn links_of_interfaces_dropped_from_the_config_are_detached_at_start() {
    let lab = Lab::new(RULE);
    let second = VethPair::new(1).unwrap();
    let both = format!(
        "interfaces = [\"{}\", \"{}\"]\nxdp_mode = \"native\"\npin_dir = \"{}\"\n\
         control_socket = \"{}\"\nmetrics = \"\"\n\n{RULE}",
        lab.pair.host,
        second.host,
        lab.pins.path.display(),
        lab.socket.display()
    );
    std::fs::write(&lab.config, both).unwrap();
    lab.start().stop();
    assert!(xdp_attached(&second.host) && xdp_attached(&lab.pair.host));

    // The second interface leaves the config; the next start detaches it.
    lab.write_config(RULE);
    let daemon = lab.start();
    assert!(
        xdp_detached_soon(&second.host),
        "a dropped interface is still enforced"
    );
    assert!(!lab.pins.path.join(format!("link_{}", second.host)).exists());
    assert!(xdp_attached(&lab.pair.host));
    let status = lab.json(&["status", "--json"]);
    assert_eq!(
        status["detached_unconfigured"],
        serde_json::json!([second.host]),
        "{status}"
    );
    assert_eq!(status["interfaces"][0]["link"], "adopted", "{status}");
    let text = lab.ok(&["status"]);
    assert!(
        text.contains(&format!(
            "interface {}: no longer configured; detached",
            second.host
        )),
        "{text}"
    );
    daemon.stop();
}

fn plan(frames: Vec<Vec<u8>>, rate: u64, count: u64) -> SendPlan {
    SendPlan {
        frames,
        rate: Some(rate),
        count,
        duration: Duration::from_secs(5),
        cpu: None,
    }
}

/// Rules for every slot but one (on addresses no test frame goes to): a rule added then
/// can only take the slot of one removed in the same change.
fn all_slots_but_one() -> String {
    (0..limiter_common::abi::MAX_RULES - 1)
        .map(|i| {
            format!(
                "[[rules]]\nname = \"filler{i}\"\ndst = \"198.19.{}.{}/32\"\nrate = 1\nburst = 1\n",
                i / 256,
                i % 256
            )
        })
        .collect()
}

#[test]
fn a_reassigned_slot_starts_with_fresh_per_source_buckets() {
    // "old" meters each source at 1/s with a burst of 60: a flood leaves this source's
    // bucket a minute in debt.
    let fillers = all_slots_but_one();
    let old = "[[rules]]\nname = \"old\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
               [rules.per_source]\nrate = 1\nburst = 60\n";
    let lab = Lab::new(&format!("{old}{fillers}"));
    let daemon = lab.start();
    flood(
        &lab.pair,
        plan(vec![udp_to_host(&lab.pair, 9, 64)], 2000, 200),
    )
    .unwrap();
    let maps = Maps::from_pins(&lab.pins.path).unwrap();
    let slot = maps.live_slots().unwrap()["old"];
    let key = SourceKey::masked(slot, 4, &v4_bytes(PEER_V4), 32, 128);
    let old_rule = maps.live_rules().unwrap()[&slot];
    let busy = |rule| {
        maps.source_cells(&key, &rule)
            .unwrap()
            .expect("the sketch is set up")
            .iter()
            .all(|&(_, tat)| tat != 0)
    };
    assert!(busy(old_rule), "the old rule's source left no state");
    assert!(lab.rule_stats("old")["dropped_packets"].as_u64().unwrap() > 0);

    // "old" goes, "new" arrives and takes its slot: 1000/s, burst 10 per source.
    let new = "[[rules]]\nname = \"new\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
               [rules.per_source]\nrate = 1000\nburst = 10\n";
    lab.write_config(&format!("{new}{fillers}"));
    lab.ok(&["reload"]);
    let maps = Maps::from_pins(&lab.pins.path).unwrap();
    assert_eq!(
        maps.live_slots().unwrap()["new"],
        slot,
        "the slot was not reused"
    );
    let new_rule = maps.live_rules().unwrap()[&slot];
    let cells = maps.source_cells(&key, &new_rule).unwrap().unwrap();
    assert!(
        cells.iter().all(|&(_, tat)| tat == 0),
        "the new limit meters this source in cells the old rule used: {cells:?}"
    );
    // Ten frames at once: the new rule's full burst admits every one.
    flood(
        &lab.pair,
        plan(vec![udp_to_host(&lab.pair, 9, 64)], 100_000, 10),
    )
    .unwrap();
    let stats = lab.rule_stats("new");
    assert_eq!(
        (
            stats["passed_packets"].as_u64().unwrap(),
            stats["dropped_packets"].as_u64().unwrap()
        ),
        (10, 0),
        "the new rule inherited the old rule's per-source debt: {stats}"
    );
    daemon.stop();
}

/// A rule removed and another added in the same reload: the new rule takes the removed
/// one's slot, and it must be born with nothing of it. Cleared while the removed rule
/// still ran, its last frames would meet a fresh bucket and be counted as the new rule's.
#[test]
fn a_slot_changes_hands_only_once_the_removed_rule_can_reach_it_no_more() {
    // Every other slot taken, so that the new rule must take the old one's.
    let fillers = all_slots_but_one();
    let old = format!(
        "[[rules]]\nname = \"old\"\ndst = \"198.18.0.2/32\"\nrate = 10\nburst = 10\n{fillers}"
    );
    // Nothing is sent to 198.18.0.99: every frame the new rule counts is the old rule's.
    let new = format!(
        "[[rules]]\nname = \"new\"\ndst = \"198.18.0.99/32\"\nrate = 10\nburst = 10\n{fillers}"
    );
    let lab = Lab::new(&old);
    let daemon = lab.start();
    let slot = Maps::from_pins(&lab.pins.path)
        .unwrap()
        .live_slots()
        .unwrap()["old"];
    // The old rule's destination flooded throughout the reloads (bounded: 12 s at most).
    let sender = lab.send_in_background(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(200_000),
        count: 2_000_000,
        duration: Duration::from_secs(12),
        cpu: None,
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut rounds = 0;
    let started = Instant::now();
    while rounds < 10 || (rounds < 40 && started.elapsed() < Duration::from_secs(6)) {
        let old_before = lab.rule_stats("old");
        assert!(
            old_before["dropped_packets"].as_u64().unwrap() > 0,
            "round {rounds}: the flood does not reach the old rule: {old_before}"
        );
        lab.write_config(&new);
        lab.ok(&["reload"]);
        assert_eq!(
            Maps::from_pins(&lab.pins.path)
                .unwrap()
                .live_slots()
                .unwrap()["new"],
            slot,
            "the slot was not reused"
        );
        let stats = lab.rule_stats("new");
        // Its refusals by reason too (`reasons`, what the per-reason metrics export).
        let by_reason: u64 = stats["reasons"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|r| r.as_object().unwrap().values())
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(
            (
                stats["passed_packets"].as_u64().unwrap(),
                stats["dropped_packets"].as_u64().unwrap(),
                by_reason
            ),
            (0, 0, 0),
            "round {rounds}: the new rule was born with the removed rule's frames: {stats}"
        );
        lab.write_config(&old);
        lab.ok(&["reload"]);
        // Until the old rule meters again (a fixed 50 ms was too short for the sender
        // on a loaded machine), before the next round.
        let back = Instant::now();
        while lab.rule_stats("old")["dropped_packets"].as_u64().unwrap() == 0
            && back.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        rounds += 1;
    }
    let sent = join(sender);
    assert!(sent.sent > 0, "nothing was sent");
    daemon.stop();
}

fn v4_bytes(addr: std::net::Ipv4Addr) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&addr.octets());
    a
}

#[test]
fn status_stats_explain_and_metrics_show_the_bypass_flag() {
    // One frame a second: a refused source stays refused for about a second.
    let lab = Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 1\nburst = 5\n");
    let daemon = lab.start();
    // Empty the rule's bucket: explain says a frame now would be dropped.
    flood(
        &lab.pair,
        plan(vec![udp_to_host(&lab.pair, 9, 64)], 10_000, 100),
    )
    .unwrap();
    let explain = || {
        lab.json(&[
            "explain",
            "--src",
            &PEER_V4.to_string(),
            "--dst",
            "198.18.0.2:9",
            "--proto",
            "udp",
            "--json",
        ])
    };
    assert_eq!(explain()["verdict"], "drop");
    assert_eq!(lab.json(&["status", "--json"])["bypass"], false);
    assert_eq!(lab.json(&["stats", "--json"])["bypass"], false);
    assert!(lab.ok(&["status"]).contains("bypass: off"));
    assert!(lab.ok(&["stats"]).contains("bypass: off"));

    // Set as README says an operator would (no limiter command sets it).
    let set = |on: bool| {
        let mut maps = Maps::from_pins(&lab.pins.path).unwrap();
        let c = maps.control().unwrap();
        let flags = if on {
            c.flags | CONTROL_BYPASS
        } else {
            c.flags & !CONTROL_BYPASS
        };
        maps.set_control(Control { flags, ..c }).unwrap();
    };
    set(true);
    assert_eq!(lab.json(&["status", "--json"])["bypass"], true);
    assert_eq!(lab.json(&["stats", "--json"])["bypass"], true);
    let text = lab.ok(&["status"]);
    assert!(text.contains("bypass: ON"), "{text}");
    let text = lab.ok(&["stats"]);
    assert!(text.contains("BYPASS ON"), "{text}");
    let mut stream = TcpStream::connect(("127.0.0.1", lab.metrics_port)).unwrap();
    std::io::Write::write_all(&mut stream, b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut stream, &mut body).unwrap();
    assert!(body.contains("\nlimiter_bypass 1\n"), "{body}");
    let why = explain();
    assert!(
        why["verdict"] == "pass"
            && why["reason"]
                .as_str()
                .unwrap()
                .contains("bypass bit is set"),
        "{why}"
    );
    set(false);
    assert_eq!(lab.json(&["status", "--json"])["bypass"], false);
    daemon.stop();
}
