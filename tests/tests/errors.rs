//! What a failing command tells the operator: its exit status (limiter_service::exit,
//! documented in `--help` and the README) and its reason, each cause said once. Rows of
//! bad inputs run through the real binaries; the ones that need a running daemon start one
//! on a veth pair.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{path::Path, process::Command};

use common::{Lab, LIMITER};
use limiter_service::exit::{repeated_fragments, Exit};
use limiter_tests::binaries::LIMITER_ALLOCATOR;

/// Runs `binary args`, and checks its status, that stderr names `says`, and that it says
/// so once, no fragment twice.
fn fails(binary: &Path, args: &[&str], status: Exit, says: &str) {
    let out = Command::new(binary)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running the binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("{} {}", binary.display(), args.join(" "));
    assert_eq!(
        out.status.code(),
        Some(i32::from(status.code())),
        "{what}: expected {status:?}; stderr: {stderr}"
    );
    assert!(
        stderr.contains(says),
        "{what}: stderr lacks {says:?}: {stderr}"
    );
    let repeated = repeated_fragments(&stderr);
    assert!(
        repeated.is_empty(),
        "{what}: said twice: {repeated:?} in {stderr}"
    );
    if status != Exit::Usage {
        // Said once: one `binary: reason` (a TOML excerpt may take more lines).
        let name = binary.file_name().unwrap().to_string_lossy();
        assert_eq!(
            stderr.matches(&format!("{name}: ")).count(),
            1,
            "{what}: {stderr}"
        );
        assert!(stderr.starts_with(&format!("{name}: ")), "{what}: {stderr}");
    }
}

/// A scratch directory with `bad.toml` (not TOML), `unknown.toml` (an unknown key), a
/// directory `dir.toml` (a config that cannot be read) and `noiface.toml` (valid, but it
/// names no interface).
fn inputs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.toml"), "rules = [\n").unwrap();
    std::fs::write(dir.path().join("unknown.toml"), "colour = \"blue\"\n").unwrap();
    std::fs::create_dir(dir.path().join("dir.toml")).unwrap();
    // The packaged config until an operator edits it: no interface, one rule.
    std::fs::write(
        dir.path().join("noiface.toml"),
        "interfaces = []\n\n[[rules]]\nname = \"web\"\ndst = \"198.18.0.10/32\"\nrate = 100\nburst = 100\n",
    )
    .unwrap();
    dir
}

fn limiter(args: &[&str], status: Exit, says: &str) {
    let dir = inputs();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("DIR", &dir.path().display().to_string()))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails(LIMITER.path(), &args, status, says);
}

fn allocator(args: &[&str], status: Exit, says: &str) {
    let dir = inputs();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("DIR", &dir.path().display().to_string()))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails(LIMITER_ALLOCATOR.path(), &args, status, says);
}

const NOT_FOUND: &str = "No such file or directory";

limiter_tests::test_rows! {
    run_missing_config => limiter(&["run", "--config", "DIR/absent.toml"], Exit::BadInput, NOT_FOUND);
    run_unreadable_config => limiter(&["run", "--config", "DIR/dir.toml"], Exit::BadInput, "Is a directory");
    run_bad_toml => limiter(&["run", "--config", "DIR/bad.toml"], Exit::BadInput, "bad.toml:");
    run_unknown_key => limiter(&["run", "--config", "DIR/unknown.toml"], Exit::BadInput, "colour");
    /// A config with no interface is bad input to `run` (3: a restart-always unit must not
    /// retry it) and refused by `check`, which judges it as `run` would.
    run_no_interface => limiter(&["run", "--config", "DIR/noiface.toml"], Exit::BadInput, "no interface to attach to");
    check_no_interface => limiter(&["check", "--config", "DIR/noiface.toml"], Exit::Failure, "no interface to attach to");
    /// `check` exits 1 for any rejection, a missing file included (README: Exit status).
    check_missing_config => limiter(&["check", "--config", "DIR/absent.toml"], Exit::Failure, NOT_FOUND);
    check_bad_toml => limiter(&["check", "--config", "DIR/bad.toml"], Exit::Failure, "bad.toml:");
    reload_daemon_not_running => limiter(&["reload", "--socket", "DIR/none.sock"], Exit::NotRunning, "no limiter daemon is listening");
    status_daemon_not_running => limiter(&["status", "--socket", "DIR/none.sock"], Exit::NotRunning, "no limiter daemon is listening");
    quota_set_daemon_not_running => limiter(&["quota", "set", "web", "--rate", "1", "--socket", "DIR/none.sock"], Exit::NotRunning, "is it running?");
    stats_no_pins => limiter(&["stats", "--pin-dir", "DIR/pins"], Exit::NotRunning, "no pinned limiter maps");
    /// No daemon and nothing pinned: there is nothing to switch.
    bypass_no_daemon_no_pins => limiter(&["bypass", "on", "--socket", "DIR/none.sock", "--pin-dir", "DIR/pins"], Exit::NotRunning, "no pinned limiter maps");
    bypass_bad_switch => limiter(&["bypass", "maybe"], Exit::Usage, "invalid value 'maybe'");
    limiter_usage => limiter(&["frobnicate"], Exit::Usage, "unrecognized subcommand");
    allocator_run_missing_config => allocator(&["run", "--config", "DIR/absent.toml"], Exit::BadInput, NOT_FOUND);
    allocator_run_bad_toml => allocator(&["run", "--config", "DIR/bad.toml"], Exit::BadInput, "bad.toml:");
    allocator_check_missing_config => allocator(&["check", "--config", "DIR/absent.toml"], Exit::Failure, NOT_FOUND);
    allocator_not_running => allocator(&["quota", "list", "--socket", "DIR/none.sock"], Exit::NotRunning, "no limiter-allocator is listening");
    allocator_usage => allocator(&["run"], Exit::Usage, "--config");
}

/// Against a running daemon: what it refuses is bad input (3), a caller without the
/// permission gets 5, and neither says anything twice.
#[test]
fn a_running_daemon_refuses_bad_requests_with_their_own_status() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n");
    let daemon = lab.start();
    let socket = lab.socket.display().to_string();
    fails(
        LIMITER.path(),
        &["quota", "set", "nosuch", "--rate", "5", "--socket", &socket],
        Exit::BadInput,
        "no rule named \"nosuch\"",
    );
    // A reload of a file that is no longer TOML: refused, nothing changes.
    std::fs::write(&lab.config, "rules = [\n").unwrap();
    fails(
        LIMITER.path(),
        &["reload", "--socket", &socket],
        Exit::BadInput,
        "limiter.toml:",
    );
    // Not root: the socket's directory is root's only.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(LIMITER.path())
        .args(["status", "--socket", &socket])
        .output()
        .expect("setpriv (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(i32::from(Exit::KernelRefused.code())),
        "{stderr}"
    );
    assert!(stderr.contains("ermission denied"), "{stderr}");
    assert!(repeated_fragments(&stderr).is_empty(), "{stderr}");
    daemon.stop();
}

/// `--help` of both binaries carries the table, with every status.
#[test]
fn help_lists_the_exit_statuses() {
    for binary in [LIMITER.path(), LIMITER_ALLOCATOR.path()] {
        let out = Command::new(binary).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(limiter_service::exit::HELP), "{help}");
        for exit in Exit::ALL {
            assert!(help.contains(&format!("\n  {}  ", exit.code())), "{help}");
        }
    }
}
