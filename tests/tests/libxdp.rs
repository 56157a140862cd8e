//! Debian's xdp-tools (libxdp's reference implementation) on this kernel: the independent
//! counterpart the hook-sharing tests need. In a guest of Debian's kernels libxdp must
//! install its multi-program dispatcher (freplace components); this machine's kernel
//! refuses freplace loads (EPERM), so libxdp falls back to a single program here, which
//! the test reports rather than asserts.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use limiter_tests::{
    netns::VethPair,
    xdp_tools::{run, LibxdpState},
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
