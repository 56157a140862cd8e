//! `cargo xtask run` with no arguments runs this lab; it must show limiting at work and
//! leave nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::process::Command;

#[test]
fn lab_limits_the_abusive_flows_and_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_limiter-lab"))
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
    assert!(
        !std::path::Path::new("/sys/fs/bpf/limiter-lab").exists(),
        "pins left behind"
    );
}
