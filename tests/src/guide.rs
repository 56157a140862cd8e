//! A shell block of the docs run as an operator copies it: found by the marker line
//! `<!-- tested: NAME … -->` right before its ```sh fence, run by bash with the binaries
//! under test first on PATH, on the test's interface and paths through the variables the
//! block declares at its top (`IFACE`, `CONFIG`, `SOCKET`, `PIN_DIR`, each
//! `${VAR:-default}`), and everything it left running stopped and detached.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// How long a block may run before it counts as hung. The libxdp guide's `limiter run`
/// verifies its builds through libxdp's dispatcher, which took more than 60 s in CI's
/// 6.1 guest under qemu's emulation on a loaded host (20 s on a quiet one): this is a
/// bound for a hang, not a speed check.
const DEADLINE: Duration = Duration::from_secs(180);

/// The shell block of `doc` (a path under docs/) right after its `<!-- tested: NAME `
/// line.
///
/// # Panics
/// When the doc, the marker or its block is missing: the test cannot run what the doc
/// says, so it fails naming what it looked for.
pub fn block(doc: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let marker = format!("<!-- tested: {name} ");
    let (_, after) = text
        .split_once(&marker)
        .unwrap_or_else(|| panic!("{} has no block marked {marker:?}", path.display()));
    let (_, after) = after.split_once('\n').unwrap_or_default();
    let body = after
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("the line after {marker:?} does not open a ```sh block"));
    body.split_once("\n```")
        .unwrap_or_else(|| panic!("the block after {marker:?} is not closed"))
        .0
        .to_string()
}

/// Where a block runs: the values of the variables it declares.
pub struct Target<'a> {
    pub iface: &'a str,
    pub config: &'a Path,
    pub socket: &'a Path,
    pub pin_dir: &'a Path,
    /// Where the block's output goes (a file of the test's temporary directory).
    pub log: PathBuf,
}

/// What a block said, and whether it ran to its end.
pub struct Run {
    pub ok: bool,
    pub said: String,
}

/// Runs `block` with `bash -euo pipefail` (a failing step fails the run, where an operator
/// would stop) on `target`, in a process group of its own: whatever it left running (a
/// daemon it started in the background) gets SIGTERM, then SIGKILL, by that group's id;
/// then `limiter detach` removes what such a daemon left on the hook and in the pins, and
/// xdp-filter is unloaded from the interface. The caller removes the interface and the
/// pin directory.
///
/// # Panics
/// When bash cannot be started or the log cannot be written.
#[allow(
    clippy::expect_used,
    reason = "a test helper: a failure fails the test"
)]
pub fn run(block: &str, target: &Target<'_>) -> Run {
    let limiter = crate::binaries::LIMITER.path();
    let bin_dir = limiter.parent().unwrap_or(Path::new("."));
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::fs::File::create(&target.log).expect("the guide's log");
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .env("PATH", path)
        .env("IFACE", target.iface)
        .env("CONFIG", target.config)
        .env("SOCKET", target.socket)
        .env("PIN_DIR", target.pin_dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the guide's log"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = i32::try_from(child.id()).expect("a pid");
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop_group(group);
    let _ = child.wait();
    let _ = Command::new(limiter)
        .arg("detach")
        .arg("--socket")
        .arg(target.socket)
        .arg("--pin-dir")
        .arg(target.pin_dir)
        .output();
    let _ = Command::new("xdp-filter")
        .args(["unload", target.iface])
        .output();
    let mut said = std::fs::read_to_string(&target.log).unwrap_or_default();
    if status.is_none() {
        said.push_str(&format!("\n(still running after {DEADLINE:?})"));
    }
    eprintln!("--- the guide said:\n{said}");
    Run {
        ok: status.is_some_and(|s| s.success()),
        said,
    }
}

/// SIGTERM to every process of `group` (the one [`run`] made), SIGKILL to what is left
/// after 5 s.
fn stop_group(group: i32) {
    // SAFETY: kill(2) on a process group this process made for the block; a group that
    // is gone answers ESRCH.
    let signal = |sig| unsafe { libc::kill(-group, sig) };
    if signal(libc::SIGTERM) != 0 {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if signal(0) != 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(libc::SIGKILL);
}
