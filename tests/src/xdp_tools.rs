//! Debian's xdp-tools (xdp-loader, xdp-filter) as the tests run them: libxdp's own
//! implementation of the multi-program protocol, the counterpart of the limiter's.

use std::{path::Path, process::Command};

/// libxdp's state directory under the default bpffs.
pub const STATE_DIR: &str = "/sys/fs/bpf/xdp";

/// Runs one of the tools; panics with its output when it fails or is missing (tests
/// only: a missing tool is a failure that names it).
pub fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("{tool} is missing ({e}): `cargo xtask setup` installs xdp-tools")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{tool} {args:?} failed: {text}");
    text
}

/// libxdp keeps its lock and dispatcher pins under [`STATE_DIR`] and leaves the directory
/// behind: one the test made goes again when this is dropped.
pub struct LibxdpState {
    made: bool,
}

impl LibxdpState {
    pub fn new() -> LibxdpState {
        LibxdpState {
            made: !Path::new(STATE_DIR).exists(),
        }
    }
}

impl Default for LibxdpState {
    fn default() -> Self {
        LibxdpState::new()
    }
}

impl Drop for LibxdpState {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir(STATE_DIR);
        }
    }
}
