//! `limiter check` and `limiter-allocator check`: a config is judged as `run` would
//! judge it, with nothing loaded, pinned, bound or created; exit status 0 or 1.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{path::Path, process::Command};

use common::LIMITER;

fn repo_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// (exit code, stdout, stderr).
fn check(binary: &Path, config: &Path) -> (i32, String, String) {
    check_with(binary, config, &[])
}

/// The same with more arguments (`--iface IF`).
fn check_with(binary: &Path, config: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(binary)
        .arg("check")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("running check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn limiter_check_accepts_the_example_and_lists_every_problem_of_a_bad_file() {
    // The example names no interface: `run` would refuse it, and so does `check`, until
    // it is given the interface `run` would be.
    let example = repo_file("limiter.example.toml");
    let (code, out, err) = check(Path::new(LIMITER), &example);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("no interface to attach to"), "{err}");
    let (code, out, err) = check_with(Path::new(LIMITER), &example, &["--iface", "lb0"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(": ok: ") && out.contains("interfaces lb0;"),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let pins = format!("/sys/fs/bpf/limiter-check-{}", std::process::id());
    let socket = dir.path().join("run/limiter.sock");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "pin_dir = \"{pins}\"\ncontrol_socket = \"{}\"\n\n[[rules]]\nname = \"a\"\n\
             dst = \"198.18.0.2/32\"\nrate = 100\n\n[[rules]]\nname = \"b\"\n\
             dst = \"198.18.0.3/32\"\nproto = \"sctp\"\nrate = 5\nburst = 5\n",
            socket.display()
        ),
    )
    .unwrap();
    let (code, out, err) = check(Path::new(LIMITER), &bad);
    assert_eq!(code, 1, "{out}{err}");
    // Both problems, each by file, line and field.
    assert!(
        err.contains("bad.toml:7:8: rules[0].burst")
            && err.contains("bad.toml:12:9: rules[1].proto"),
        "{err}"
    );
    // What only the rule compiler sees is refused too: 17 rules over one destination.
    let deep = dir.path().join("deep.toml");
    let rules: String = (16..=32)
        .map(|len| {
            format!(
                "[[rules]]\nname = \"r{len}\"\ndst = \"198.18.0.0/{len}\"\nrate = 1\nburst = 1\n\n"
            )
        })
        .collect();
    std::fs::write(&deep, rules).unwrap();
    let (code, _, err) = check(Path::new(LIMITER), &deep);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("covered by 17 rules"), "{err}");
    // Nothing was created where the daemon would have.
    assert!(!Path::new(&pins).exists(), "check created the pin dir");
    assert!(
        !socket.parent().unwrap().exists(),
        "check created the socket dir"
    );
}

#[test]
fn allocator_check_reads_the_tls_files_and_changes_nothing() {
    let allocator = Path::new(LIMITER).with_file_name("limiter-allocator");
    let dir = tempfile::tempdir().unwrap();
    let pki = common::pki::Pki::new(dir.path());
    let server = pki.pair("allocator");
    let socket = dir.path().join("run/allocator.sock");
    let config = |report_ms: u64, ca: &Path| {
        format!(
            "listen = \"127.0.0.1:0\"\nmetrics = \"\"\ncontrol_socket = \"{}\"\n\
             lease_ttl_ms = 3000\nreport_interval_ms = {report_ms}\nmax_hosts = 8\n\
             max_connections_per_ip = 4\nhandshake_timeout_ms = 2000\n\n[tls]\n\
             ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\n[[quotas]]\nrule = \"web\"\n\
             rate = 100\nburst = 10\n",
            socket.display(),
            ca.display(),
            server.cert.display(),
            server.key.display()
        )
    };
    let path = dir.path().join("allocator.toml");
    std::fs::write(&path, config(1000, &pki.ca())).unwrap();
    let (code, out, err) = check(&allocator, &path);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(": ok: ") && out.contains("1 quotas"), "{out}");
    std::fs::write(&path, config(3000, &pki.ca())).unwrap();
    let (code, _, err) = check(&allocator, &path);
    assert_eq!(code, 1);
    assert!(err.contains("report_interval_ms < lease_ttl_ms"), "{err}");
    // Every problem at once, each by file, line, column and field.
    std::fs::write(
        &path,
        config(3000, &pki.ca()).replace("max_hosts = 8", "max_hosts = 0\nmax_host = 8"),
    )
    .unwrap();
    let (code, _, err) = check(&allocator, &path);
    assert_eq!(code, 1);
    let shown = |needle: &str| err.lines().any(|l| l.contains(needle));
    for needle in [
        "allocator.toml:5:22: report_interval_ms: need 0 < report_interval_ms < lease_ttl_ms",
        "allocator.toml:6:13: max_hosts: must be between 1 and 1000000, got 0",
        "allocator.toml:7:1: max_host: unknown key \"max_host\"",
    ] {
        assert!(shown(needle), "{needle:?} not in:\n{err}");
    }
    let missing = dir.path().join("no-such-ca.pem");
    std::fs::write(&path, config(1000, &missing)).unwrap();
    let (code, _, err) = check(&allocator, &path);
    assert_eq!(code, 1);
    assert!(err.contains("no-such-ca.pem"), "{err}");
    assert!(
        !socket.parent().unwrap().exists(),
        "check created the socket dir"
    );
}
