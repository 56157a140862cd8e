//! The tail-call handoff through BPF_PROG_TEST_RUN: the real limiter, the stand-in load
//! balancer (whose verdict, XDP_TX, neither the limiter nor the stack gives), one frame
//! a row. What the limiter passes reaches the LB, what it drops does not, a missing or
//! replaced LB program fails open and is counted.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::net::Ipv4Addr;

use limiter_common::abi::Handoff;
use limiter_tests::{
    fixture::{self, Loaded},
    frame::{FrameBuilder, ETH_P_LLDP},
    handoff::{HandoffArrays, StandinLb, LB, LB_V2, ROOT, XDP_DROP, XDP_PASS, XDP_TX},
};
use limiter_user::host::object::Variant;

/// One rule with a burst of 3 and a rate too low to refill during the test.
const RULES: &str = r#"
[[rules]]
name = "lb-vip"
dst = "198.18.7.10/32"
proto = "udp"
rate = 1
burst = 3
"#;

fn vip_frame() -> Vec<u8> {
    FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 7, 1), Ipv4Addr::new(198, 18, 7, 10))
        .udp(4000, 53)
        .build()
}

fn unmatched_frame() -> Vec<u8> {
    FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 7, 1), Ipv4Addr::new(198, 18, 7, 99))
        .udp(4000, 53)
        .build()
}

fn non_ip_frame() -> Vec<u8> {
    FrameBuilder::ethertype(ETH_P_LLDP, &[0u8; 46]).build()
}

/// An IPv4 header cut short: malformed, passed.
fn malformed_frame() -> Vec<u8> {
    let mut f = vip_frame();
    f.truncate(14 + 10);
    f
}

/// The limiter with only `variant`'s build verified (every build's maps, the handoff
/// arrays among them): each build verified and left unused here cost the 6.1 guest
/// seconds of emulated verification per test, and that every build loads is
/// `kernel_report`'s check.
fn loaded(variant: Variant) -> (Loaded, HandoffArrays) {
    let mut l = fixture::load_build(RULES, variant).unwrap();
    let arrays = HandoffArrays::take(&mut l.program).unwrap();
    (l, arrays)
}

/// The single-buffer build hands every pass (matched, unmatched, non-IP, malformed) to
/// the LB, never a drop; the LB's count equals the limiter's passes.
#[test]
fn passed_frames_reach_the_lb_and_dropped_ones_do_not() {
    let lb = StandinLb::load().unwrap();
    let (mut l, mut arrays) = loaded(Variant::Linear);
    arrays.linear.set(0, lb.fd(LB).unwrap(), 0).unwrap();
    l.maps.set_handoff(Handoff { first: 0, slots: 1 }).unwrap();

    let rows: [(&str, Vec<u8>, u32); 7] = [
        ("vip 1 (burst)", vip_frame(), XDP_TX),
        ("vip 2 (burst)", vip_frame(), XDP_TX),
        ("vip 3 (burst)", vip_frame(), XDP_TX),
        ("vip 4 (over the limit)", vip_frame(), XDP_DROP),
        ("unmatched", unmatched_frame(), XDP_TX),
        ("non-IP", non_ip_frame(), XDP_TX),
        ("malformed", malformed_frame(), XDP_TX),
    ];
    let before = l.snapshot().unwrap();
    for (what, frame, expected) in &rows {
        assert_eq!(l.run(frame).unwrap(), *expected, "{what}");
    }
    let d = fixture::delta(&before, &l.snapshot().unwrap());
    let rule = d.rules["lb-vip"];
    let passes = rule.passed_packets + d.global.unmatched + d.global.non_ip + d.global.malformed;
    let tx = rows.iter().filter(|r| r.2 == XDP_TX).count() as u64;
    assert_eq!(lb.seen(LB).unwrap(), tx, "the LB saw every pass");
    assert_eq!(passes, tx, "the limiter's passes are what the LB saw");
    assert_eq!(
        rule.dropped_packets,
        rows.iter().filter(|r| r.2 == XDP_DROP).count() as u64
    );
    assert_eq!(l.maps.handoff_counters().unwrap().missing, 0);
}

/// The LB's program removed from the slot: frames pass to the stack and are counted;
/// a replacement gets the next frame, the old program none.
#[test]
fn a_removed_lb_fails_open_and_a_replaced_one_gets_the_frames() {
    let lb = StandinLb::load().unwrap();
    let (mut l, mut arrays) = loaded(Variant::Linear);
    arrays.linear.set(0, lb.fd(LB).unwrap(), 0).unwrap();
    l.maps.set_handoff(Handoff { first: 0, slots: 1 }).unwrap();
    assert_eq!(l.run(&unmatched_frame()).unwrap(), XDP_TX);

    arrays.linear.clear_index(&0).unwrap();
    for _ in 0..5 {
        assert_eq!(l.run(&unmatched_frame()).unwrap(), XDP_PASS, "fail open");
    }
    // Drops stay drops without a next program.
    for _ in 0..3 {
        l.run(&vip_frame()).unwrap();
    }
    assert_eq!(l.run(&vip_frame()).unwrap(), XDP_DROP);
    assert_eq!(l.maps.handoff_counters().unwrap().missing, 5 + 3);
    assert_eq!(lb.seen(LB).unwrap(), 1);

    arrays.linear.set(0, lb.fd(LB_V2).unwrap(), 0).unwrap();
    assert_eq!(l.run(&unmatched_frame()).unwrap(), XDP_TX);
    assert_eq!(lb.seen(LB_V2).unwrap(), 1);
    assert_eq!(
        lb.seen(LB).unwrap(),
        1,
        "the replaced program gets nothing more"
    );

    // No handoff configured: frames pass to the stack and nothing is counted missing.
    l.maps.set_handoff(Handoff::default()).unwrap();
    assert_eq!(l.run(&unmatched_frame()).unwrap(), XDP_PASS);
    assert_eq!(l.maps.handoff_counters().unwrap().missing, 8);
}

/// A prog array belongs to one program type and one xdp.frags flag: the kernel refuses
/// the plain XDP LB in the multi-buffer build's array, and that build fails open.
#[test]
fn the_multi_buffer_build_cannot_take_a_plain_xdp_program_and_fails_open() {
    let lb = StandinLb::load().unwrap();
    let (mut l, mut arrays) = loaded(Variant::MultiBuffer);
    let refused = arrays.multi.set(0, lb.fd(LB).unwrap(), 0);
    assert!(
        refused.is_err(),
        "the kernel took a plain XDP program into a frags array"
    );
    l.maps.set_handoff(Handoff { first: 0, slots: 1 }).unwrap();
    assert_eq!(l.run(&unmatched_frame()).unwrap(), XDP_PASS);
    assert_eq!(l.maps.handoff_counters().unwrap().missing, 1);
}

/// Katran's shared mode with join_program_array's layout: the root calls slot 0 (the
/// limiter), the limiter calls on to slots 1.. (the LB), through the root's own array.
#[test]
fn the_root_calls_the_limiter_which_calls_the_next_slot() {
    let mut lb = StandinLb::load().unwrap();
    let (l, _arrays) = loaded(Variant::Linear);
    let dir = PinDir::new();
    let root_pin = dir.0.join("root_array");
    lb.pin_root_array(&root_pin).unwrap();
    // The limiter's linear build, loaded again with the root's array as its handoff
    // array, as the daemon does for join_program_array.
    let mut joined = limiter_user::attach::program::Program::load_builds(
        &limiter_user::attach::program::LoadOptions {
            pin_dir: None,
            max_sources: 1024,
            handoff_array: Some(root_pin.clone()),
        },
        &[Variant::Linear],
    )
    .unwrap();
    let mut jmaps = joined.maps().unwrap();
    limiter_user::daemon::apply_rules(&mut jmaps, &l.config).unwrap();
    jmaps
        .set_handoff(
            limiter_user::attach::handoff::plan(
                Some(&limiter_user::config::HandoffSpec::Join {
                    array: root_pin.clone(),
                    index: 0,
                }),
                Some(4),
            )
            .unwrap(),
        )
        .unwrap();
    let lb_fd = lb.fd(LB).unwrap().try_clone().unwrap();
    let limiter_fd = joined
        .program_fd(Variant::Linear)
        .unwrap()
        .try_clone()
        .unwrap();
    {
        let mut root = lb.root_array().unwrap();
        root.set(0, &limiter_fd, 0).unwrap();
        root.set(2, &lb_fd, 0).unwrap();
    }
    let run_root = |lb: &StandinLb, frame: &[u8]| {
        use aya::programs::{TestRun, TestRunOptions};
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        lb.program(ROOT)
            .unwrap()
            .test_run(opts)
            .unwrap()
            .return_value
    };
    // Slot 1 empty, slot 2 the LB: the limiter tries its slots in order.
    for _ in 0..3 {
        assert_eq!(run_root(&lb, &vip_frame()), XDP_TX);
    }
    assert_eq!(run_root(&lb, &vip_frame()), XDP_DROP, "the limiter's drop");
    assert_eq!(lb.seen(LB).unwrap(), 3);
    assert_eq!(lb.seen(ROOT).unwrap(), 0, "the root never fell through");
    // The LB leaves: the limiter fails open, counted.
    lb.root_array().unwrap().clear_index(&2).unwrap();
    assert_eq!(run_root(&lb, &unmatched_frame()), XDP_PASS);
    assert_eq!(jmaps.handoff_counters().unwrap().missing, 1);
    // The limiter leaves (limiter detach): the root reaches the LB directly.
    {
        let mut root = lb.root_array().unwrap();
        root.set(1, &lb_fd, 0).unwrap();
        root.clear_index(&0).unwrap();
    }
    assert_eq!(run_root(&lb, &vip_frame()), XDP_TX, "no limiter: no drop");
    drop(l);
}

/// A directory on bpffs for this test's pins, removed with its content on drop (also
/// when the test fails).
struct PinDir(std::path::PathBuf);

impl PinDir {
    fn new() -> PinDir {
        let dir = std::path::PathBuf::from(format!(
            "/sys/fs/bpf/limiter-handoff-test-{}",
            std::process::id()
        ));
        limiter_user::attach::program::prepare_pin_dir(&dir).unwrap();
        PinDir(dir)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
