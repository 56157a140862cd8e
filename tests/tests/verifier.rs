//! A build the kernel's verifier refuses: the daemon says why (build, kernel, errno, the
//! log's last lines) and exits non-zero, and the program already attached keeps
//! enforcing with its rules and counters. Real binary, real kernel, real frames.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{join, Lab, LIMITER};
use limiter_tests::{scenario::udp_to_host, traffic::SendPlan};

/// The object's section holding the multi-buffer build (`#[xdp(frags)]`).
const MULTI_BUFFER_SECTION: &str = "xdp.frags";

/// Byte range of section `name` in a little-endian ELF64 object.
fn section(elf: &[u8], name: &str) -> std::ops::Range<usize> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF object");
    assert_eq!((elf[4], elf[5]), (2, 1), "not ELF64 little-endian");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    for i in 0..shnum {
        let h = header(i);
        let at = strtab + u32_at(h);
        let len = elf[at..].iter().position(|&b| b == 0).unwrap();
        if &elf[at..at + len] == name.as_bytes() {
            let (offset, size) = (u64_at(h + 0x18), u64_at(h + 0x20));
            return offset..offset + size;
        }
    }
    panic!("no section {name} in the object");
}

/// The built-in object with the first instruction of the multi-buffer build replaced
/// by `r0 = *(u64 *)(r9 + 0)`: a read of a register nothing initialised. The ELF and
/// every relocation stay valid (the first instruction is no map load), so aya loads the
/// object and only the verifier can refuse it.
fn broken_object() -> Vec<u8> {
    let mut elf = limiter_user::host::object::OBJECT.to_vec();
    let text = section(&elf, MULTI_BUFFER_SECTION);
    let first = &mut elf[text.start..text.start + 8];
    assert_ne!(
        first[0], 0x18,
        "the first instruction is a 64-bit immediate load"
    );
    first.copy_from_slice(&[0x79, 0x90, 0, 0, 0, 0, 0, 0]);
    elf
}

#[test]
fn a_refused_build_says_why_and_the_running_program_keeps_enforcing() {
    let rate = 2000u64;
    let lab = Lab::new(&format!(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = {rate}\nburst = 200\n"
    ));
    let broken = lab.dir.path().join("broken.bpf.o");
    std::fs::write(&broken, broken_object()).unwrap();

    let daemon = lab.start();
    let running = lab.attached_program().expect("daemon A attached nothing");
    // Offered well above the rate (and within what an emulated guest sends: 15-20 k/s).
    let offered = 10_000u64;
    let traffic = |secs: u64| SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(offered),
        count: offered * secs,
        duration: Duration::from_secs(secs + 2),
        cpu: None,
    };
    // A enforces under traffic, and is killed in the middle of it.
    let sender = lab.send_in_background(traffic(2));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    let first = join(sender);
    std::thread::sleep(Duration::from_millis(200));
    let after_a = lab.rule_stats("web");
    let count = |stats: &serde_json::Value, field: &str| stats[field].as_u64().unwrap();
    assert!(
        count(&after_a, "dropped_packets") > 0,
        "daemon A did not enforce"
    );
    assert_eq!(
        count(&after_a, "passed_packets") + count(&after_a, "dropped_packets"),
        first.sent,
        "frames went uncounted under daemon A"
    );

    // The second daemon, with the broken build: it must exit by itself, non-zero.
    let mut child = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .arg("--bpf-object")
        .arg(&broken)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting limiter run");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon with a refused build was still running after 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    eprintln!("--- stderr of the refused start ---\n{stderr}---");
    assert!(!status.success(), "a refused build exited with {status}");

    let version = limiter_user::host::kernel::running().expect("kernel version");
    let release = limiter_user::host::kernel::release().expect("uname release");
    for needed in [
        // What the kernel check at start found, logged before loading.
        format!("kernel {version}: builds linear"),
        "verifier refused the multi-buffer build (program `limiter`)".to_string(),
        format!("on Linux {version} (release {release})"),
        "os error 13".to_string(),
        "verifier log, last".to_string(),
        // The failing instruction and the verifier's reason, as the kernel logged them.
        "  | 0: (79) r0 = *(u64 *)(r9 +0)".to_string(),
        "  | R9 !read_ok".to_string(),
    ] {
        assert!(stderr.contains(&needed), "stderr lacks {needed:?}");
    }

    // Nothing changed: the link runs A's program, with A's maps and counters…
    assert_eq!(
        lab.attached_program(),
        Some(running),
        "the refused start changed the attached program"
    );
    assert!(lab
        .pins
        .path
        .join(format!("link_{}", lab.pair.host))
        .exists());
    let after_refusal = lab.rule_stats("web");
    assert_eq!(
        after_refusal, after_a,
        "the refused start changed the rule or its counters"
    );

    // …and it still enforces: drops continue, at the configured rate (plus at most the
    // burst the bucket refilled while no traffic came), every frame counted.
    let second = join(lab.send_in_background(traffic(3)));
    std::thread::sleep(Duration::from_millis(200));
    let end = lab.rule_stats("web");
    let delta = |field: &str| count(&end, field) - count(&after_refusal, field);
    let (passed, dropped) = (delta("passed_packets"), delta("dropped_packets"));
    let span = second.span.as_secs_f64();
    eprintln!(
        "after the refusal: sent {} in {span:.2}s, passed {passed}, dropped {dropped}",
        second.sent
    );
    assert!(
        dropped > 0,
        "no drops after the refused start: not enforcing"
    );
    assert_eq!(passed + dropped, second.sent, "frames went uncounted");
    let (low, high) = (rate as f64 * span, rate as f64 * span + 200.0);
    assert!(
        passed as f64 >= low * 0.97 && passed as f64 <= high * 1.03,
        "passed {passed} in {span:.2}s, expected {low:.0}..{high:.0}"
    );
}
