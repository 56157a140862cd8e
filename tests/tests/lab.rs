//! `cargo xtask run` with no arguments runs this lab; it must show limiting at work and
//! leave nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::process::Command;

use limiter_tests::binaries::LIMITER_LAB;

#[test]
fn lab_limits_the_abusive_flows_and_cleans_up() {
    let out = Command::new(LIMITER_LAB)
        .args(["--duration", "4"])
        .output()
        .expect("running limiter-lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lab failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let final_table = stdout.rsplit("final:").next().unwrap();
    let dropped = |rule: &str| -> u64 {
        let line = final_table
            .lines()
            .find(|l| l.starts_with(rule))
            .unwrap_or_else(|| panic!("no {rule} row in {final_table}"));
        line.split_whitespace().nth(5).unwrap().parse().unwrap()
    };
    assert!(dropped("contoso-web") > 0, "the abusive client was not cut");
    assert!(dropped("contoso-syn") > 0, "the SYN flood was not cut");
    assert!(stdout.contains("cleaned up"));
    // Its stdout is a pipe here: tables one after another, no clear-screen escapes.
    assert!(
        !stdout.contains('\x1b'),
        "terminal escapes written into a pipe: {stdout:?}"
    );
    assert!(
        !std::path::Path::new("/sys/fs/bpf/limiter-lab").exists(),
        "pins left behind"
    );
}

/// `cargo xtask run -- --lab-lb`: the same lab in front of a stand-in load balancer. The
/// stand-in sees every frame the limiter passed (the rules' passes and more: unmatched
/// traffic), none it dropped, and its pin goes with the lab.
#[test]
fn lab_in_front_of_a_standin_lb_hands_it_what_passes() {
    let out = Command::new(LIMITER_LAB)
        .args(["--lb", "--duration", "4"])
        .output()
        .expect("running limiter-lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lab failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("stand-in load balancer: saw"))
        .unwrap_or_else(|| panic!("no stand-in line in {stdout}"));
    let numbers: Vec<u64> = last
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (seen, passed) = (numbers[0], numbers[1]);
    assert!(passed > 0 && seen >= passed, "{last}");
    assert!(stdout.contains("cleaned up"));
    assert!(
        !std::path::Path::new("/sys/fs/bpf/limiter-lab-standin-lb").exists(),
        "the stand-in's pin was left behind"
    );
}
