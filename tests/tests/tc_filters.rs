//! `xdp_mode = "tc"` on kernels without tcx (before 6.6): the TC build as a cls_bpf
//! filter in one fixed slot of clsact ingress, replaced in place on restart, shown by
//! `status`, removed by `detach`, never duplicated by a retry, never left behind by an
//! error. On this machine's kernel the tests take that path through
//! `LIMITER_TC_HOOK=cls_bpf`; in a Debian 6.1 guest (`cargo xtask test --kernel 6.1`)
//! it is the only path there is.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{process::Command, time::Duration};

use aya::{
    programs::{
        tc::{NlOptions, TcAttachOptions, TcHandle},
        SchedClassifier, TcAttachType,
    },
    Ebpf,
};
use common::{join_timed, Daemon, Lab, LIMITER};
use limiter_tests::{
    rx::RxCounter,
    scenario::{model_admits, udp_to_host},
    traffic::SendPlan,
};
use limiter_user::{
    attach::tc_filter::{self, HANDLE, PRIORITY},
    host::{kernel, object::BASELINE_OBJECT},
};

/// The rule's rate and burst: 2000/s and 200, a tenth in a guest (which moves only
/// 15–20 k frames/s).
fn rate_and_burst() -> (u64, u64) {
    (
        limiter_tests::guest_scale(2000),
        limiter_tests::guest_scale(200),
    )
}

fn rules() -> String {
    let (rate, burst) = rate_and_burst();
    format!(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
         rate = {rate}\nburst = {burst}\n"
    )
}

/// On a kernel with tcx, take the filter path anyway (the daemon inherits it).
fn filter_path() {
    if kernel::has_tcx() {
        // SAFETY (edition 2021: safe): set before any daemon starts; every test of this
        // file wants the same value.
        std::env::set_var(kernel::TC_HOOK_ENV, "cls_bpf");
    }
    assert!(!kernel::has_tcx());
}

fn ifindex(iface: &str) -> u32 {
    limiter_tests::netns::ifindex(iface).unwrap()
}

/// Every bpf filter at ingress of `iface`, as the kernel lists them.
fn filters(iface: &str) -> Vec<tc_filter::Filter> {
    tc_filter::ingress_filters(ifindex(iface)).unwrap_or_default()
}

/// What `tc filter show` says, to check our reading of the kernel against iproute2's.
fn tc_show(iface: &str) -> String {
    let out = Command::new("tc")
        .args(["filter", "show", "dev", iface, "ingress"])
        .output()
        .expect("tc (iproute2)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_no_filters(iface: &str) {
    assert_eq!(filters(iface), vec![], "{}", tc_show(iface));
}

fn has_clsact(iface: &str) -> bool {
    let out = Command::new("tc")
        .args(["qdisc", "show", "dev", iface])
        .output()
        .expect("tc (iproute2)");
    String::from_utf8_lossy(&out.stdout).contains("clsact")
}

fn plan(rate: u64, duration: Duration, lab: &Lab) -> SendPlan {
    SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(rate),
        count: (rate as f64 * duration.as_secs_f64()) as u64,
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

fn run_fails(lab: &Lab) -> String {
    let out = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .output()
        .expect("limiter run");
    assert!(!out.status.success(), "limiter run should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_kill_9_and_restart_replace_the_filter_in_place_and_meter_every_frame() {
    filter_path();
    let lab = Lab::with_mode(&rules(), "tc");
    assert!(!has_clsact(&lab.pair.host));
    let daemon = lab.start();
    let status = lab.json(&["status", "--json"]);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["mode"], "tc", "{status}");
    assert_eq!(iface["link"], "created", "{status}");
    assert!(
        iface["hook"]
            .as_str()
            .unwrap()
            .starts_with("cls_bpf filter"),
        "{status}"
    );
    assert_eq!(iface["pin"], serde_json::Value::Null, "{status}");
    let first = iface["program_id"].as_u64().expect("a program id");
    let before = filters(&lab.pair.host);
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!((before[0].priority, before[0].handle), (PRIORITY, HANDLE));
    assert_eq!(before[0].program_id, Some(first as u32));
    assert!(
        tc_show(&lab.pair.host).contains("limiter_tc"),
        "{}",
        tc_show(&lab.pair.host)
    );

    // A later filter (higher priority number) sees what the limiter passed.
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let sender = lab.send_timed_in_background(plan(
        limiter_tests::guest_scale(20_000),
        Duration::from_secs(4),
        &lab,
    ));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    // The filter outlives the daemon: still there, still the same program.
    let after_kill = filters(&lab.pair.host);
    assert_eq!(
        after_kill.iter().filter(|f| f.priority == PRIORITY).count(),
        1,
        "{after_kill:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let restarted = lab.start();
    let status = lab.json(&["status", "--json"]);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["link"], "adopted", "{status}");
    let second = iface["program_id"].as_u64().expect("a program id");
    assert_ne!(second, first, "the program was not replaced");
    let sent = join_timed(sender);
    std::thread::sleep(Duration::from_millis(200));

    let now = filters(&lab.pair.host);
    let ours: Vec<_> = now.iter().filter(|f| f.priority == PRIORITY).collect();
    assert_eq!(
        ours.len(),
        1,
        "one filter in the slot, not a second: {now:?}"
    );
    assert_eq!(ours[0].program_id, Some(second as u32));
    let web = lab.rule_stats("web");
    let passed = web["passed_packets"].as_u64().unwrap();
    let dropped = web["dropped_packets"].as_u64().unwrap();
    let (rate, burst) = rate_and_burst();
    // One bucket through the kill and the restart: what a model bucket admits of the
    // frames as they were sent (a sender descheduled while the new daemon loads, which
    // takes seconds in an emulated guest, offers nothing meanwhile).
    let expected = model_admits(std::slice::from_ref(&sent), rate, burst, |_| true) as f64;
    let span = sent.report.span.as_secs_f64();
    eprintln!(
        "cls_bpf: sent {} in {span:.2}s: passed {passed} (model {expected:.0}; rate x span + burst {:.0}), dropped {dropped}",
        sent.report.sent,
        rate as f64 * span + burst as f64,
    );
    assert!(
        (passed as f64 - expected).abs() <= expected * 0.02,
        "passed {passed}, expected {expected:.0}"
    );
    // Every frame that arrived was metered, through the kill and the restart.
    assert_eq!(rx.totals().unwrap().packets, passed);
    assert_eq!(passed + dropped, sent.report.sent, "frames unmetered");
    restarted.stop();
}

#[test]
fn with_a_clsact_qdisc_present_retries_add_nothing_and_detach_removes_the_filter() {
    filter_path();
    let lab = Lab::with_mode(&rules(), "tc");
    // The operator followed "Parent Qdisc doesn't exist" and added one.
    let out = Command::new("tc")
        .args(["qdisc", "add", "dev", &lab.pair.host, "clsact"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..3 {
        lab.start().stop();
        let now = filters(&lab.pair.host);
        assert_eq!(now.len(), 1, "each start adds at most one filter: {now:?}");
    }
    // No daemon: `detach` finds the filter on the interface and removes it.
    let out = lab.ok(&["detach"]);
    assert!(out.contains("cls_bpf filter"), "{out}");
    assert_no_filters(&lab.pair.host);
    // The qdisc is not the limiter's to remove: another tool may use it.
    assert!(has_clsact(&lab.pair.host));

    // With a daemon: `detach` asks it, and the filter goes too.
    let daemon = lab.start();
    assert_eq!(filters(&lab.pair.host).len(), 1);
    lab.ok(&["detach"]);
    // The daemon detached and exited; dropping the handle only reaps it.
    drop(daemon);
    assert_no_filters(&lab.pair.host);
}

#[test]
fn a_failed_start_leaves_nothing_that_detach_does_not_remove() {
    filter_path();
    let lab = Lab::with_mode(&rules(), "tc");
    // Two interfaces, the second missing: the first gets its filter, then the start
    // fails.
    let text = std::fs::read_to_string(&lab.config).unwrap().replace(
        &format!("interfaces = [\"{}\"]", lab.pair.host),
        &format!("interfaces = [\"{}\", \"lmnosuch0\"]", lab.pair.host),
    );
    std::fs::write(&lab.config, text).unwrap();
    let err = run_fails(&lab);
    assert!(err.contains("lmnosuch0"), "{err}");
    // What stayed enforcing is the limiter's filter in its slot, and detach finds it.
    let left = filters(&lab.pair.host);
    assert!(left.len() <= 1, "{left:?}");
    let out = lab.ok(&["detach"]);
    if !left.is_empty() {
        assert!(out.contains("cls_bpf filter"), "{out}");
    }
    assert_no_filters(&lab.pair.host);
}

#[test]
fn a_foreign_filter_in_the_slot_is_refused_and_kept() {
    filter_path();
    let lab = Lab::with_mode(&rules(), "tc");
    let _ = aya::programs::tc::qdisc_add_clsact(&lab.pair.host);
    let mut foreign = Ebpf::load(BASELINE_OBJECT).unwrap();
    let prog: &mut SchedClassifier = foreign.program_mut("rx_count").unwrap().try_into().unwrap();
    prog.load().unwrap();
    let id = prog
        .attach_with_options(
            &lab.pair.host,
            TcAttachType::Ingress,
            TcAttachOptions::Netlink(NlOptions {
                priority: PRIORITY,
                handle: TcHandle::from(HANDLE),
                classid: None,
            }),
        )
        .unwrap();
    let foreign_id = prog.info().unwrap().id();
    let err = run_fails(&lab);
    assert!(err.contains("belongs to someone else"), "{err}");
    assert!(err.contains(&format!("program {foreign_id}")), "{err}");
    let now = filters(&lab.pair.host);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].program_id, Some(foreign_id));
    // `detach` does not touch it either.
    lab.ok(&["detach"]);
    assert_eq!(filters(&lab.pair.host).len(), 1);
    prog.detach(id).unwrap();
}

#[test]
fn a_native_start_removes_the_filter_an_earlier_tc_run_left() {
    filter_path();
    let lab = Lab::with_mode(&rules(), "tc");
    lab.start().stop();
    assert_eq!(filters(&lab.pair.host).len(), 1);
    // Same interface, pins and socket; XDP now.
    let text = std::fs::read_to_string(&lab.config)
        .unwrap()
        .replace("xdp_mode = \"tc\"", "xdp_mode = \"native\"");
    std::fs::write(&lab.config, text).unwrap();
    let daemon: Daemon = lab.start();
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["interfaces"][0]["mode"], "native", "{status}");
    assert_eq!(
        filters(&lab.pair.host),
        vec![],
        "the tc run's filter would meter every frame again: {}",
        tc_show(&lab.pair.host)
    );
    daemon.stop();
}
