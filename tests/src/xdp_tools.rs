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

/// libxdp's dispatcher pins for one interface (`STATE_DIR/dispatch-IFINDEX-ID`, one
/// directory per dispatcher), removed on drop if still there. libxdp removes them when it
/// detaches a dispatcher; a process killed while joining one (a guide block stopped at
/// its deadline) leaves them, and the next test that finds STATE_DIR not empty fails for
/// what this one left.
pub struct DispatcherPins {
    prefix: String,
}

impl DispatcherPins {
    pub fn of(ifindex: u32) -> DispatcherPins {
        DispatcherPins {
            prefix: format!("dispatch-{ifindex}-"),
        }
    }
}

impl Drop for DispatcherPins {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::read_dir(STATE_DIR) else {
            return;
        };
        for entry in dir.filter_map(Result::ok) {
            if !entry
                .file_name()
                .to_string_lossy()
                .starts_with(&self.prefix)
            {
                continue;
            }
            // A bpffs directory goes once its pins are unlinked.
            let path = entry.path();
            if let Ok(pins) = std::fs::read_dir(&path) {
                for pin in pins.filter_map(Result::ok) {
                    let _ = std::fs::remove_file(pin.path());
                }
            }
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// xdp-filter on an interface with one rule (drop UDP to `port`), unloaded on drop.
pub struct XdpFilter {
    iface: String,
    loaded: bool,
}

impl XdpFilter {
    pub fn load(iface: &str, port: u16) -> XdpFilter {
        run("xdp-filter", &["load", iface, "--mode", "native"]);
        let f = XdpFilter {
            iface: iface.to_string(),
            loaded: true,
        };
        run(
            "xdp-filter",
            &["port", &port.to_string(), "--proto", "udp", "--mode", "dst"],
        );
        f
    }

    pub fn unload(&mut self) {
        run("xdp-filter", &["unload", &self.iface]);
        self.loaded = false;
    }

    /// Unloaded by other means (xdp-loader): nothing to do on drop.
    pub fn forget(mut self) {
        self.loaded = false;
    }

    /// (frames xdp-filter saw, frames it dropped): its aggregate per-action statistics.
    pub fn seen_and_dropped(&self) -> (u64, u64) {
        let status = run("xdp-filter", &["status"]);
        let count = |action: &str| -> u64 {
            status
                .lines()
                .find(|l| l.trim_start().starts_with(action))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {action} count in:\n{status}"))
        };
        let (pass, drop) = (count("XDP_PASS"), count("XDP_DROP"));
        (pass + drop, drop)
    }
}

impl Drop for XdpFilter {
    fn drop(&mut self) {
        if self.loaded {
            let _ = Command::new("xdp-filter")
                .args(["unload", &self.iface])
                .output();
        }
    }
}

/// Whether libxdp itself installs its dispatcher on this kernel (its own verdict: it
/// needs freplace), from xdp-filter on a veth pair of its own.
pub fn libxdp_installs_a_dispatcher() -> bool {
    let pair = crate::netns::VethPair::new(1)
        .unwrap_or_else(|e| panic!("creating a veth pair for xdp-filter: {e}"));
    run("xdp-filter", &["load", &pair.host]);
    let status = run("xdp-loader", &["status", &pair.host]);
    run("xdp-filter", &["unload", &pair.host]);
    status.contains("xdp_dispatcher")
}
