//! `xdp_share_fallback = "tail-call"`: where the kernel refuses freplace (this machine's
//! does; libxdp then loads xdp-filter as a single program through netlink), the limiter
//! takes the hook from the program there and tail-calls it. Against Debian's xdp-filter:
//! both enforce; kill -9 and restart keep every frame metered by both; `limiter detach`
//! gives xdp-filter its hook back; what netlink cannot replace, or a pin in the way, is
//! refused with nothing changed.
//!
//! These tests need a kernel that refuses freplace, which libxdp itself is asked about:
//! on one that accepts it they fail saying so (the guests of `cargo xtask test --kernel`
//! run `sharing.rs`, the dispatcher's tests, instead).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{process::Command, time::Duration};

use common::{join, two_ports, Lab};
use limiter_tests::{
    guide,
    rx::RxCounter,
    tools,
    xdp_tools::{libxdp_installs_a_dispatcher, LibxdpState, XdpFilter},
};
use serde_json::Value;

const WEB: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\ndst_port = 9\n\
                   proto = \"udp\"\nrate = 2000\nburst = 200\n";
/// xdp-filter drops UDP to this port.
const FILTERED_PORT: u16 = 7;
const FALLBACK: &str = "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"";

fn needs_freplace_refused() {
    assert!(
        !libxdp_installs_a_dispatcher(),
        "this kernel accepts freplace (libxdp installs its dispatcher), so the fallback has \
         nothing to fall back from: these tests need a kernel that refuses it, such as this \
         project's CI host; the dispatcher's own tests are in sharing.rs"
    );
}

/// Sends `rate` frames/s for `secs`, half to each port; returns the frames per port and
/// the span of the sending.
fn send_both(lab: &Lab, rate: u64, secs: u64) -> (u64, Duration) {
    let sent = join(lab.send_in_background(two_ports(
        &lab.pair,
        FILTERED_PORT,
        rate,
        Duration::from_secs(secs),
    )));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sent.sent % 2, 0, "an even count alternates the two frames");
    (sent.sent / 2, sent.span)
}

fn counter(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// (passed, dropped) of rule web.
fn web(lab: &Lab) -> (u64, u64) {
    let web = lab.rule_stats("web");
    (
        counter(&web, "passed_packets"),
        counter(&web, "dropped_packets"),
    )
}

fn taken_pin(lab: &Lab) -> std::path::PathBuf {
    lab.pins.path.join(format!("taken_{}", lab.pair.host))
}

/// Whether an XDP bpf_link runs program `id` (bpftool's view).
fn held_by_a_link(id: u32) -> bool {
    tools::bpftool_links()
        .unwrap()
        .iter()
        .any(|l| l.is_xdp() && l.prog_id == id)
}

/// The limiter takes xdp-filter's hook and tail-calls it: both enforce, `status` shows
/// the chain, kill -9 and a restart under traffic leave no frame unmetered by either, and
/// `limiter detach` gives the hook back to the very program it took.
#[test]
fn the_limiter_takes_xdp_filters_hook_and_both_enforce_through_restarts() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let lab = Lab::with_settings(WEB, "native", FALLBACK);
    let filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let xdp_filter = lab.attached_program().expect("xdp-filter on the hook");
    assert!(
        !held_by_a_link(xdp_filter),
        "libxdp attached through netlink"
    );
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();

    let ours = lab.attached_program().expect("a program on the hook");
    assert_ne!(ours, xdp_filter, "the limiter is not on the hook");
    assert!(
        !held_by_a_link(ours),
        "the takeover keeps the hook netlink-attached"
    );
    let taken =
        aya::programs::ProgramInfo::from_pin(taken_pin(&lab)).expect("the taken program is pinned");
    assert_eq!(taken.id(), xdp_filter);
    let status = lab.json(&["status", "--json"]);
    let chain = status["interfaces"][0]["chain"].as_array().unwrap().clone();
    assert_eq!(chain.len(), 2, "{status:#}");
    assert_eq!(chain[0]["program_id"], ours, "{status:#}");
    assert_eq!(chain[0]["limiter"], true);
    assert_eq!(chain[1]["program_id"], xdp_filter, "{status:#}");
    assert_eq!(chain[1]["limiter"], false);
    let how = chain[0]["how"].as_str().unwrap();
    assert!(
        how.contains("refuses freplace") && how.contains("tail call"),
        "{how}"
    );
    let text = lab.ok(&["status"]);
    eprintln!("{text}");
    assert!(text.contains("xdpfilt"), "{text}");

    // Both enforce: the limiter meters its port and drops over the rate; xdp-filter
    // gets every frame the limiter passes and drops its port; the stack gets the rest.
    let (seen0, dropped0) = filter.seen_and_dropped();
    let (each, _) = send_both(&lab, 20_000, 2);
    let (seen, dropped) = filter.seen_and_dropped();
    let (passed, limited) = web(&lab);
    eprintln!(
        "{each} per port: limiter passed {passed} dropped {limited}; xdp-filter saw {} \
         dropped {}; the stack got {}",
        seen - seen0,
        dropped - dropped0,
        rx.totals().unwrap().packets
    );
    assert_eq!(passed + limited, each, "frames the limiter did not meter");
    assert!(limited > 0, "the limiter never limited");
    assert_eq!(
        dropped - dropped0,
        each,
        "frames to xdp-filter's port it did not drop"
    );
    assert_eq!(
        seen - seen0,
        passed + each,
        "xdp-filter saw what the limiter dropped"
    );
    assert_eq!(rx.totals().unwrap().packets, passed);

    // kill -9 under traffic: the hook keeps the limiter and its handoff; the restart
    // replaces the limiter's program in place, taking nothing else.
    let (passed0, limited0) = web(&lab);
    let (_, dropped0) = filter.seen_and_dropped();
    let rx0 = rx.totals().unwrap().packets;
    let sender = lab.send_in_background(two_ports(
        &lab.pair,
        FILTERED_PORT,
        8_000,
        Duration::from_secs(4),
    ));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    assert_eq!(
        lab.attached_program(),
        Some(ours),
        "the hook lost the limiter"
    );
    std::thread::sleep(Duration::from_millis(500));
    let restarted = lab.start();
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["interfaces"][0]["link"], "adopted", "{status:#}");
    let second = lab.attached_program().unwrap();
    assert_ne!(second, ours, "the limiter's program was not replaced");
    assert_ne!(second, xdp_filter);
    assert_eq!(
        aya::programs::ProgramInfo::from_pin(taken_pin(&lab))
            .unwrap()
            .id(),
        xdp_filter,
        "the restart took its own program for the LB's"
    );
    let sent = join(sender);
    std::thread::sleep(Duration::from_millis(200));
    let each = sent.sent / 2;
    let (passed, limited) = web(&lab);
    let (passed, limited) = (passed - passed0, limited - limited0);
    let (_, dropped) = filter.seen_and_dropped();
    eprintln!(
        "through kill -9 and restart, {each} per port: limiter passed {passed} dropped \
         {limited}; xdp-filter dropped {}",
        dropped - dropped0
    );
    assert_eq!(passed + limited, each, "frames the limiter did not meter");
    assert_eq!(dropped - dropped0, each, "frames xdp-filter did not see");
    assert_eq!(rx.totals().unwrap().packets - rx0, passed);
    assert!(
        !tools::bpftool_prog_loaded(ours).unwrap(),
        "the killed daemon's program is still loaded"
    );

    // detach: xdp-filter gets its hook back, and enforces alone.
    lab.ok(&["detach"]);
    let _ = restarted;
    assert_eq!(
        lab.attached_program(),
        Some(xdp_filter),
        "the hook did not go back to xdp-filter"
    );
    assert!(!taken_pin(&lab).exists(), "the taken program's pin is left");
    let (_, dropped0) = filter.seen_and_dropped();
    let rx0 = rx.totals().unwrap().packets;
    let (each, _) = send_both(&lab, 4_000, 1);
    let (_, dropped) = filter.seen_and_dropped();
    assert_eq!(dropped - dropped0, each, "xdp-filter stopped enforcing");
    assert_eq!(
        rx.totals().unwrap().packets - rx0,
        each,
        "the other port's frames"
    );
}

/// Without the key the limiter refuses and names it; after a takeover, a config without
/// it gives the hook back at the next start (and then refuses, as without it).
#[test]
fn without_the_key_nothing_is_taken_and_an_earlier_takeover_is_given_back() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let mut lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let _filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let xdp_filter = lab.attached_program().unwrap();
    let err = lab.run_must_fail();
    assert!(
        err.contains("xdpfilt") && err.contains("xdp_share_fallback = \"tail-call\""),
        "{err}"
    );
    assert_eq!(
        lab.attached_program(),
        Some(xdp_filter),
        "the hook was touched"
    );
    assert!(!taken_pin(&lab).exists());

    lab.settings = FALLBACK.to_string();
    lab.write_config(WEB);
    let daemon = lab.start();
    assert_ne!(lab.attached_program(), Some(xdp_filter));
    daemon.stop();
    // A clean stop leaves the takeover running, as it leaves a link.
    assert_ne!(lab.attached_program(), Some(xdp_filter));

    lab.settings = "xdp_share = \"libxdp\"".to_string();
    lab.write_config(WEB);
    let err = lab.run_must_fail();
    assert!(err.contains("xdp_share_fallback"), "{err}");
    assert_eq!(
        lab.attached_program(),
        Some(xdp_filter),
        "the start without the fallback did not give the hook back"
    );
    assert!(!taken_pin(&lab).exists());
}

/// On an empty hook the fallback attaches the limiter alone through netlink (as libxdp
/// loads a single program there), adopts it on restart, and detach empties the hook.
#[test]
fn on_an_empty_hook_the_limiter_runs_alone_through_netlink() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let lab = Lab::with_settings(WEB, "native", FALLBACK);
    let daemon = lab.start();
    let ours = lab.attached_program().expect("the limiter on the hook");
    assert!(!held_by_a_link(ours), "attached through netlink");
    assert!(!taken_pin(&lab).exists());
    let status = lab.json(&["status", "--json"]);
    let chain = status["interfaces"][0]["chain"].as_array().unwrap().clone();
    assert_eq!(chain.len(), 1, "{status:#}");
    assert!(
        chain[0]["how"].as_str().unwrap().contains("alone"),
        "{status:#}"
    );
    daemon.kill9();
    let restarted = lab.start();
    assert_eq!(
        lab.json(&["status", "--json"])["interfaces"][0]["link"],
        "adopted"
    );
    assert_ne!(lab.attached_program(), Some(ours));
    lab.ok(&["detach"]);
    let _ = restarted;
    assert_eq!(lab.attached_program(), None, "detach left the hook taken");
}

/// What the fallback cannot take is refused with the reason, and nothing changes: a
/// program held by a bpf_link (netlink cannot replace it), and someone else's object at
/// the pin the limiter would use.
#[test]
fn what_cannot_be_taken_is_refused_and_left_alone() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let lab = Lab::with_settings(WEB, "native", FALLBACK);
    {
        let mut ebpf = aya::Ebpf::load(limiter_user::host::object::BASELINE_OBJECT).unwrap();
        let prog: &mut aya::programs::Xdp = ebpf
            .program_mut("baseline_pass")
            .unwrap()
            .try_into()
            .unwrap();
        prog.load().unwrap();
        prog.attach(&lab.pair.host, aya::programs::XdpMode::Default)
            .unwrap();
        let before = lab.attached_program().unwrap();
        assert!(held_by_a_link(before));
        let err = lab.run_must_fail();
        assert!(
            err.contains("baseline_pass") && err.contains("bpf_link"),
            "{err}"
        );
        assert_eq!(lab.attached_program(), Some(before));
        assert!(!taken_pin(&lab).exists());
    }
    // Someone else's map where the taken program's pin goes: refused, kept.
    let _filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let xdp_filter = lab.attached_program().unwrap();
    std::fs::create_dir_all(&lab.pins.path).unwrap();
    let status = Command::new("bpftool")
        .args(["map", "create"])
        .arg(taken_pin(&lab))
        .args([
            "type", "array", "key", "4", "value", "4", "entries", "1", "name", "not_ours",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "bpftool map create");
    let err = lab.run_must_fail();
    assert!(
        err.contains(&taken_pin(&lab).display().to_string()) && err.contains("map"),
        "{err}"
    );
    assert_eq!(
        lab.attached_program(),
        Some(xdp_filter),
        "the hook was touched"
    );
    assert!(
        aya::maps::MapInfo::from_pin(taken_pin(&lab)).is_ok(),
        "the foreign map was removed"
    );
    std::fs::remove_file(taken_pin(&lab)).unwrap();
}

/// xdp-filter's own tools while the limiter holds its hook: a new rule applies at once
/// (the program the limiter calls is xdp-filter's, with its maps); an unload or another
/// load is refused by libxdp and changes nothing, so neither side can take the other down.
#[test]
fn xdp_filters_tools_keep_working_and_cannot_undo_the_takeover() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let lab = Lab::with_settings(WEB, "native", FALLBACK);
    let filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let ours = lab.attached_program().unwrap();
    // xdp-filter now also drops UDP to 9, the limiter's port: what the limiter passes
    // there is dropped after it.
    limiter_tests::xdp_tools::run(
        "xdp-filter",
        &["port", "9", "--proto", "udp", "--mode", "dst"],
    );
    let (passed0, limited0) = web(&lab);
    let (_, dropped0) = filter.seen_and_dropped();
    let rx0 = rx.totals().unwrap().packets;
    let (each, _) = send_both(&lab, 4_000, 1);
    let (passed, limited) = web(&lab);
    let (_, dropped) = filter.seen_and_dropped();
    assert_eq!(passed - passed0 + limited - limited0, each);
    assert_eq!(
        dropped - dropped0,
        each + passed - passed0,
        "xdp-filter's new rule did not apply to what the limiter passed"
    );
    assert_eq!(
        rx.totals().unwrap().packets,
        rx0,
        "the stack got a dropped frame"
    );
    for args in [
        vec!["xdp-filter", "unload", lab.pair.host.as_str()],
        vec!["xdp-filter", "load", lab.pair.host.as_str()],
    ] {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        eprintln!(
            "{args:?}: {} {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            lab.attached_program(),
            Some(ours),
            "{args:?} changed the hook"
        );
    }
    let (passed0, _) = web(&lab);
    let (_, dropped0) = filter.seen_and_dropped();
    let (each, _) = send_both(&lab, 4_000, 1);
    let (_, dropped) = filter.seen_and_dropped();
    assert_eq!(
        dropped - dropped0,
        each + web(&lab).0 - passed0,
        "xdp-filter stopped enforcing"
    );
    // What does take the hook away is the operator's `xdp-loader unload --all`, which
    // removes whatever single program is there: then frames go to the stack unmetered
    // (fail open), `status` says the limiter is off the hook, and the next start puts it
    // back alone, dropping the pin of the program it no longer holds the hook for.
    limiter_tests::xdp_tools::run("xdp-loader", &["unload", &lab.pair.host, "--all"]);
    assert_eq!(lab.attached_program(), None);
    let status = lab.ok(&["status"]);
    eprintln!("{status}");
    assert!(
        status.contains("NOT RUNNING") && status.contains("no longer there"),
        "{status}"
    );
    let rx0 = rx.totals().unwrap().packets;
    let (each, _) = send_both(&lab, 4_000, 1);
    assert_eq!(
        rx.totals().unwrap().packets - rx0,
        2 * each,
        "not failing open"
    );
    daemon.stop();
    let restarted = lab.start();
    assert!(lab.attached_program().is_some());
    assert!(
        !taken_pin(&lab).exists(),
        "a pin of a program no longer handed frames"
    );
    let status = lab.json(&["status", "--json"]);
    assert_eq!(
        status["interfaces"][0]["chain"].as_array().unwrap().len(),
        1,
        "{status:#}"
    );
    restarted.stop();
    filter.forget();
}

// ---------------------------------------------------------------------------------------
// The guide in docs/sharing.md, run as an operator copies it.

/// Runs docs/sharing.md's block `block` on the lab's interface, config, socket and pins.
fn run_guide(lab: &Lab, block: &str) -> guide::Run {
    guide::run(
        block,
        &guide::Target {
            iface: &lab.pair.host,
            config: &lab.config,
            socket: &lab.socket,
            pin_dir: &lab.pins.path,
            log: lab.dir.path().join("guide.log"),
        },
    )
}

/// docs/sharing.md's step by step for the fallback runs as written, against Debian's
/// xdp-filter and the real `limiter`: the limiter takes xdp-filter's hook and status shows
/// it tail-calling it; detach gives the very program back; the daemon is gone.
#[test]
fn the_fallback_guide_runs_as_written() {
    let _state = LibxdpState::new();
    needs_freplace_refused();
    let lab = Lab::new(WEB);
    let block = guide::block("docs/sharing.md", "fallback-guide");
    assert!(
        block.contains("limiter run") && !block.contains("cargo"),
        "the guide runs the installed limiter, not the build tool:\n{block}"
    );
    let run = run_guide(&lab, &block);
    assert!(run.ok, "the guide failed:\n{}", run.said);
    assert!(
        run.said.contains("xdpfilt") && run.said.contains("tail call"),
        "status does not show the limiter tail-calling xdp-filter:\n{}",
        run.said
    );
    assert!(
        !lab.socket.exists(),
        "the daemon is still there after detach"
    );
    assert!(
        !taken_pin(&lab).exists(),
        "the taken program is still pinned"
    );
}

/// The harness catches the guide's old mistake: the keys appended after the last
/// `[[rules]]` table are keys of that rule, which `check` refuses, and the run stops
/// there (no daemon started).
#[test]
fn the_fallback_guide_test_catches_keys_appended_after_the_rules() {
    let _state = LibxdpState::new();
    let lab = Lab::new(WEB);
    let block = guide::block("docs/sharing.md", "fallback-guide");
    let sed = block
        .lines()
        .find(|l| l.starts_with("sed -i '1i xdp_share"))
        .expect("the guide puts the keys at the top with sed")
        .to_string();
    let appended = block.replace(
        &sed,
        "cat >> \"$CONFIG\" <<'TOML'\nxdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"\nTOML",
    );
    let run = run_guide(&lab, &appended);
    assert!(
        !run.ok,
        "keys appended after the rules passed:\n{}",
        run.said
    );
    assert!(
        run.said.contains("xdp_share"),
        "check does not name the misplaced key:\n{}",
        run.said
    );
    assert!(!lab.socket.exists(), "a daemon started");
}
