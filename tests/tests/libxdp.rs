//! Debian's xdp-tools (libxdp's reference implementation) on this kernel: the independent
//! counterpart the hook-sharing tests need. In a guest of Debian's kernels libxdp must
//! install its multi-program dispatcher (freplace components); this machine's kernel
//! refuses freplace loads (EPERM), so libxdp falls back to a single program here, which
//! the test reports rather than asserts.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use limiter_tests::{
    guide,
    netns::VethPair,
    scenario::PinDir,
    xdp_tools::{libxdp_installs_a_dispatcher, run, DispatcherPins, LibxdpState},
};

#[test]
fn xdp_filter_loads_and_xdp_loader_lists_it() {
    let state = LibxdpState::new();
    let pair = VethPair::new(1).expect("creating the veth pair");
    let load = run("xdp-filter", &["load", &pair.host, "-v"]);
    let status = run("xdp-loader", &["status", &pair.host]);
    let unload = std::panic::catch_unwind(|| run("xdp-filter", &["unload", &pair.host]));
    drop(state);
    let dispatcher = status.contains("xdp_dispatcher");
    eprintln!("{load}\n{status}\nlibxdp dispatcher installed: {dispatcher}");
    assert!(status.contains("xdpfilt_"), "{status}");
    if limiter_tests::in_guest() {
        assert!(
            dispatcher,
            "libxdp fell back to a single program in the guest: {load}"
        );
    }
    assert!(unload.is_ok(), "xdp-filter unload failed");
}

/// docs/sharing.md's step by step for `xdp_share = "libxdp"` in front of xdp-filter, run
/// as written with Debian's xdp-tools and the real `limiter`. Where libxdp installs its
/// dispatcher (Debian's kernels, `cargo xtask test --kernel`) it runs to its end and
/// xdp-loader and status show the chain; where the kernel refuses freplace (this
/// machine's) it stops where the guide says: the daemon refuses to start, naming
/// `xdp_share_fallback`.
#[test]
fn the_libxdp_guide_runs_as_written_or_names_the_fallback() {
    let _state = LibxdpState::new();
    let dispatcher = libxdp_installs_a_dispatcher();
    let pair = VethPair::new(1).expect("creating the veth pair");
    // Dropped before the pair and `_state`: a guide stopped at its deadline may leave them.
    let _dispatchers = DispatcherPins::of(pair.host_ifindex().unwrap());
    let pins = PinDir::new();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limiter.toml");
    let socket = dir.path().join("run/limiter.sock");
    std::fs::write(
        &config,
        format!(
            "interfaces = [\"{}\"]\nxdp_mode = \"native\"\npin_dir = \"{}\"\n\
             control_socket = \"{}\"\nmetrics = \"\"\n\n[[rules]]\nname = \"web\"\n\
             dst = \"198.18.0.2/32\"\nrate = 2000\nburst = 200\n",
            pair.host,
            pins.path.display(),
            socket.display()
        ),
    )
    .unwrap();
    let block = guide::block("docs/sharing.md", "libxdp-guide");
    assert!(
        block.contains("limiter run") && !block.contains("cargo"),
        "the guide runs the installed limiter, not the build tool:\n{block}"
    );
    let run = guide::run(
        &block,
        &guide::Target {
            iface: &pair.host,
            config: &config,
            socket: &socket,
            pin_dir: &pins.path,
            log: dir.path().join("guide.log"),
        },
    );
    if dispatcher {
        assert!(run.ok, "the guide failed:\n{}", run.said);
        for shown in ["xdp_dispatcher", "limiter_libxdp", "xdpfilt"] {
            assert!(run.said.contains(shown), "no {shown} in:\n{}", run.said);
        }
    } else {
        assert!(
            !run.ok,
            "the guide ran to its end on a kernel that refuses freplace:\n{}",
            run.said
        );
        assert!(
            run.said.contains("xdp_share_fallback"),
            "the daemon's refusal does not name the fallback:\n{}",
            run.said
        );
    }
}
