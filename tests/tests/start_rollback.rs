//! An all-or-nothing start: a start failed after each of its steps in turn (the
//! fault-injection seam of the test build, `limiter-user/fault-injection`) leaves the
//! pins, the links, the interfaces' XDP programs and TC filters (and any dispatcher),
//! the taken programs' pins and the control socket's directory exactly as they were
//! before it (but for the socket's lock file, which stays by design, as after every run:
//! limiter-instance). Then the same start, not failed, runs; and stopped with `detach`, the host
//! is as before once more.
//!
//! Fresh starts, each configured interface empty before: an earlier daemon's link that a
//! start adopts keeps the new program when the start then fails (documented in
//! limiter-user/src/daemon/start.rs).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use limiter_tests::{
    netns::VethPair,
    scenario::PinDir,
    tools::{bpftool, bpftool_links},
    xdp_tools::{libxdp_installs_a_dispatcher, LibxdpState, XdpFilter},
};
use limiter_user::{
    config::Config,
    daemon::{
        start::{fault, StartStep},
        Daemon,
    },
};
use serde_json::Value;

/// What a start may change on this host, as the tools see it.
#[derive(Debug, PartialEq)]
struct HostState {
    /// pin_dir's entries (maps, links, programs, taken programs); `None`: no pin_dir.
    pins: Option<Vec<String>>,
    /// libxdp's dispatcher directories for these interfaces (`/sys/fs/bpf/xdp/
    /// dispatch-IFINDEX-ID`), where the libxdp protocol pins a dispatcher's components.
    dispatchers: Vec<String>,
    /// The control socket's directory's entries but its lock file.
    socket_dir: Vec<String>,
    /// Per interface: what `bpftool net show dev` lists (XDP programs and dispatchers,
    /// cls_bpf filters), and the BPF links bpftool places on it (type, program). A tcx
    /// link shows in neither on an older bpftool; it is seen by its pin (a start that
    /// failed holds no descriptor: a link without a pin is gone).
    hooks: Vec<Hook>,
}

/// One interface: its name, `bpftool net show dev`, the names of the XDP programs it
/// lists (a dispatcher is `xdp_dispatcher`), its links (type, program).
type Hook = (String, Value, Vec<String>, Vec<(String, u32)>);

fn entries(dir: &Path) -> Option<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Some(names)
}

fn host_state(pins: &Path, socket_dir: &Path, pairs: &[VethPair]) -> Result<HostState> {
    let links = bpftool_links()?;
    let mut hooks = Vec::new();
    for pair in pairs {
        let ifindex = pair.host_ifindex()?;
        let net = bpftool(&["net", "show", "dev", &pair.host])
            .with_context(|| format!("bpftool net show dev {}", pair.host))?;
        let mut names = Vec::new();
        for xdp in net[0]["xdp"].as_array().into_iter().flatten() {
            let id = xdp["id"].as_u64().context("an XDP entry without an id")?;
            let prog = bpftool(&["prog", "show", "id", &id.to_string()])?;
            names.push(prog["name"].as_str().unwrap_or_default().to_string());
        }
        let on: Vec<(String, u32)> = links
            .iter()
            .filter(|l| l.ifindex == Some(ifindex))
            .map(|l| (l.kind.clone(), l.prog_id))
            .collect();
        hooks.push((pair.host.clone(), net, names, on));
    }
    let ours: Vec<String> = pairs
        .iter()
        .map(|p| Ok(format!("dispatch-{}-", p.host_ifindex()?)))
        .collect::<Result<_>>()?;
    let dispatchers = entries(Path::new("/sys/fs/bpf/xdp"))
        .unwrap_or_default()
        .into_iter()
        .filter(|name| ours.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    Ok(HostState {
        pins: entries(pins),
        dispatchers,
        socket_dir: entries(socket_dir)
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name != "limiter.lock")
            .collect(),
        hooks,
    })
}

fn config(pins: &Path, socket: &Path, pairs: &[VethPair], mode: &str, share: &str) -> Config {
    let ifaces: Vec<String> = pairs.iter().map(|p| format!("\"{}\"", p.host)).collect();
    let text = format!(
        "interfaces = [{}]\n\
         pin_dir = \"{}\"\n\
         control_socket = \"{}\"\n\
         xdp_mode = \"{mode}\"\n\
         {share}\n\
         [[rules]]\n\
         name = \"rollback-rule\"\n\
         dst = \"198.18.0.2/32\"\n\
         rate = 100\n\
         burst = 10\n",
        ifaces.join(", "),
        pins.display(),
        socket.display()
    );
    Config::parse(&text, Path::new("/etc/limiter/limiter.toml")).unwrap()
}

/// Fails a start after each step in turn, then starts for real and detaches. `share`:
/// top-level config lines for how the XDP hook is shared ("" for exclusive). Returns
/// what the tools saw while the started daemon ran.
fn every_step_undone(mode: &str, share: &str) -> String {
    let pairs = [VethPair::new(1).unwrap(), VethPair::new(1).unwrap()];
    undone_on(&pairs, mode, share)
}

/// [`every_step_undone`] over `pairs`, whose hooks may hold programs already.
fn undone_on(pairs: &[VethPair], mode: &str, share: &str) -> String {
    let pins = PinDir::new();
    let dir = tempfile::tempdir().unwrap();
    // A directory the claim creates, so its removal is checked too.
    let socket_dir: PathBuf = dir.path().join("run");
    let socket = socket_dir.join("limiter.sock");
    let ifaces: Vec<String> = pairs.iter().map(|p| p.host.clone()).collect();
    let before = host_state(&pins.path, &socket_dir, pairs).unwrap();
    let mut left_behind = Vec::new();
    for step in StartStep::ALL {
        fault::fail_after(Some(step));
        let started = Daemon::start(
            Path::new("/etc/limiter/limiter.toml"),
            config(&pins.path, &socket, pairs, mode, share),
            &ifaces,
        );
        fault::fail_after(None);
        match started {
            Ok(_) => panic!("{mode}: the start failed after {step:?} succeeded"),
            Err(e) => assert!(
                e.to_string().contains("fault injected"),
                "{mode}: the start failed before the step {step:?}: {e}"
            ),
        }
        let after = host_state(&pins.path, &socket_dir, pairs).unwrap();
        if after != before {
            left_behind.push(format!(
                "after {step:?}:\n    before {before:?}\n    after  {after:?}"
            ));
            // The next step starts from the same host as the first.
            let _ = limiter_user::attach::teardown::remove_pins(&pins.path);
            let _ = std::fs::remove_dir(&pins.path);
            let _ = std::fs::remove_dir_all(&socket_dir);
        }
    }
    assert!(
        left_behind.is_empty(),
        "{mode}: a failed start left things behind\n  {}",
        left_behind.join("\n  ")
    );
    // The same start, not failed: it does change the host (the check above can fail),
    // and detached it leaves it as before.
    let daemon = Daemon::start(
        Path::new("/etc/limiter/limiter.toml"),
        config(&pins.path, &socket, pairs, mode, share),
        &ifaces,
    )
    .unwrap();
    let running = host_state(&pins.path, &socket_dir, pairs).unwrap();
    assert_ne!(running, before, "{mode}: a start that changes nothing");
    daemon.detach_all().unwrap();
    assert_eq!(
        host_state(&pins.path, &socket_dir, pairs).unwrap(),
        before,
        "{mode}: detached"
    );
    format!("{running:?}")
}

#[test]
fn a_failed_start_in_generic_mode_leaves_the_host_as_it_was() {
    every_step_undone("generic", "");
}

#[test]
fn a_failed_start_in_native_mode_leaves_the_host_as_it_was() {
    every_step_undone("native", "");
}

#[test]
fn a_failed_start_in_tc_mode_leaves_the_host_as_it_was() {
    every_step_undone("tc", "");
}

/// The libxdp protocol's start where this kernel refuses freplace: the tail-call
/// fallback (the limiter's root program on the hook, the handoff arrays pinned). A failed
/// start leaves none of it behind.
#[test]
fn a_failed_start_with_the_tail_call_fallback_leaves_the_host_as_it_was() {
    // The daemon's libxdp path makes libxdp's state directory: it goes with the test.
    let _state = LibxdpState::new();
    let running = every_step_undone(
        "native",
        "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"",
    );
    // Which path ran depends on the kernel: say which, and hold the other test to it.
    if limiter_tests::in_guest() {
        assert!(running.contains("xdp_dispatcher"), "{running}");
    } else {
        assert!(
            running.contains("limiter_linear") && running.contains("HANDOFF_LINEAR"),
            "the fallback did not run: {running}"
        );
    }
}

/// In libxdp's dispatcher (freplace): a failed start leaves no dispatcher, no
/// dispatcher directory under /sys/fs/bpf/xdp and no component behind.
#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn a_failed_start_in_a_libxdp_dispatcher_leaves_the_host_as_it_was() {
    assert!(
        limiter_tests::in_guest(),
        "libxdp's dispatcher needs freplace: run with `cargo xtask test --kernel 6.1 -- start_rollback`"
    );
    let _state = LibxdpState::new();
    let running = every_step_undone("native", "xdp_share = \"libxdp\"");
    // Seen by both checks: on the hook, and its directory (so the state compared before
    // and after a failed start would show one left behind).
    assert!(
        running.contains("xdp_dispatcher") && running.contains("dispatch-"),
        "no libxdp dispatcher while the daemon ran: {running}"
    );
}

/// The fallback taking over a program already on a hook (xdp-filter, attached by libxdp
/// through netlink where freplace is refused): a failed start puts the very program it
/// took back on the hook and leaves no `taken_*` pin; detached, the same.
#[test]
fn a_failed_takeover_gives_the_hook_back_to_the_program_it_took() {
    // First: the check below runs libxdp, which makes its state directory.
    let _state = LibxdpState::new();
    assert!(
        !libxdp_installs_a_dispatcher(),
        "this kernel accepts freplace, so the fallback takes nothing over here: the \
         dispatcher's rollback is a_failed_start_in_a_libxdp_dispatcher_leaves_the_host_as_it_was"
    );
    // One interface: the fallback hands over to one program only, and refuses a
    // takeover with other interfaces configured (a test of its own: fallback.rs).
    let pairs = [VethPair::new(1).unwrap()];
    let _filter = XdpFilter::load(&pairs[0].host, 5353);
    let running = undone_on(
        &pairs,
        "native",
        "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"",
    );
    // It was taken over: pinned while the daemon ran, the limiter on the hook.
    assert!(
        running.contains(&format!("taken_{}", pairs[0].host)) && running.contains("limiter_linear"),
        "the fallback took nothing over: {running}"
    );
}
