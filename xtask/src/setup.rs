//! Installs what a fresh machine of this kind lacks. Each step checks first, so a
//! machine that has everything is done in well under a second.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::run_cmd;

/// Debian packages: LLVM 22 for bpf-linker, bpftool for inspecting maps, iproute2 for
/// the tests' namespaces and veth pairs, nftables for the comparison benchmark, tmux for
/// the tests that run `limiter top` in a terminal; `cargo xtask dist` and its tests:
/// dpkg-dev (dpkg-shlibdeps), binutils (strip), lintian, man-db (`man -l`), systemd
/// (`systemd-analyze verify`), zsh and fish (the completions parse); prometheus for
/// promtool (the tests lint both metrics endpoints with `promtool check metrics`, and
/// check and unit-test dist/prometheus's alert rules with `promtool check rules` and
/// `promtool test rules`); tshark and tcpdump read `limiter monitor --pcap`'s captures
/// back.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "bpftool",
    "iproute2",
    "nftables",
    "tmux",
    "dpkg-dev",
    "binutils",
    "lintian",
    "man-db",
    "systemd",
    "zsh",
    "fish",
    "prometheus",
    "tshark",
    "tcpdump",
    // The allocator replicas: etcd-client's build runs protoc, whose well-known types
    // (google/protobuf/descriptor.proto) come in libprotobuf-dev; the replica tests and
    // the fleet lab run etcd.
    "protobuf-compiler",
    "libprotobuf-dev",
    "etcd-server",
];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

pub fn run() -> Result<()> {
    nightly_rust_src()?;
    apt_packages()?;
    // On a new machine both take a minute or more: bpf-linker's build is CPU-bound,
    // the packages' install mostly waits on dpkg. They share nothing (bpf-linker needs
    // LLVM, installed above), so they run at once.
    std::thread::scope(|scope| {
        let soak = scope.spawn(soak_packages);
        let linker = bpf_linker();
        let soak = soak
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("installing the soak's packages panicked")));
        linker.and(soak)
    })
}

/// The soak's load balancers, services, clients and attack tools (`cargo xtask soak`,
/// tests/tests/soak.rs): ipvsadm (used where the kernel has IPVS), haproxy, nginx, wrk,
/// h2load (nghttp2-client), hping3.
const SOAK_APT_PACKAGES: &[&str] = &[
    "ipvsadm",
    "haproxy",
    "nginx",
    "wrk",
    "nghttp2-client",
    "hping3",
];

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";
const OUR_POLICY: &str =
    "#!/bin/sh\n# cargo xtask setup: no service starts while it installs\nexit 101\n";

/// What is at [`POLICY_RC_D`] before the soak's packages are installed.
#[derive(Debug, PartialEq, Eq)]
enum StartPolicy {
    Absent,
    /// Setup's own, left by a run that was stopped half way.
    Ours,
    /// Another, which refuses starting nginx and haproxy (exit 101).
    RefusesStarts,
    /// Another, which would let a service start.
    Other,
}

fn start_policy(policy: &Path) -> StartPolicy {
    let refuses = |service: &str| {
        Command::new(policy)
            .args([service, "start"])
            .status()
            .is_ok_and(|s| s.code() == Some(101))
    };
    match std::fs::read_to_string(policy).ok().as_deref() {
        None if !policy.exists() => StartPolicy::Absent,
        Some(OUR_POLICY) => StartPolicy::Ours,
        _ if refuses("nginx") && refuses("haproxy") => StartPolicy::RefusesStarts,
        _ => StartPolicy::Other,
    }
}

/// Debian's maintainer scripts start nginx and haproxy on install: a service on this
/// machine's own network, listening on :80 of the root namespace. Installing under a
/// policy-rc.d that refuses every start (exit 101) keeps them stopped; their units are
/// disabled too, so no boot starts them. Fails if anything listens on :80 afterwards.
///
/// A policy-rc.d that is already there (container images ship one that refuses
/// everything) is used as it is when it refuses both starts, and left in place; one that
/// would let either start is not replaced: setup stops and says so.
fn soak_packages() -> Result<()> {
    if SOAK_APT_PACKAGES.iter().all(|p| installed(p)) {
        return Ok(());
    }
    let policy = Path::new(POLICY_RC_D);
    let p = policy.display();
    let write_ours = match start_policy(policy) {
        // Ours, left by a setup that was stopped half way: replaced and removed below.
        StartPolicy::Absent | StartPolicy::Ours => true,
        StartPolicy::RefusesStarts => false,
        StartPolicy::Other => bail!(
            "{p} exists already, is not setup's and does not refuse starting nginx and \
             haproxy (`{p} nginx start` and `{p} haproxy start` must both exit 101): \
             setup installs them under a policy-rc.d that refuses every service start and \
             will not replace another; install {} with it in place, or move it aside for \
             the install",
            SOAK_APT_PACKAGES.join(" ")
        ),
    };
    if write_ours {
        std::fs::write(policy, OUR_POLICY)
            .with_context(|| format!("writing {}", policy.display()))?;
        std::fs::set_permissions(policy, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .with_context(|| format!("making {} executable", policy.display()))?;
    } else {
        eprintln!(
            "setup: {} refuses service starts already: installing under it, leaving it",
            policy.display()
        );
    }
    let installed = install_apt(SOAK_APT_PACKAGES);
    if write_ours {
        let removed = std::fs::remove_file(policy);
        installed?;
        removed.with_context(|| format!("removing {}", policy.display()))?;
    } else {
        installed?;
    }
    for unit in ["nginx", "haproxy"] {
        // Not fatal: on a machine without systemd there is nothing to enable.
        let _ = Command::new("systemctl")
            .args(["disable", "--quiet", unit])
            .output();
    }
    let listening =
        output_ok(Command::new("ss").args(["-Hltn", "sport = :80"])).unwrap_or_default();
    if !listening.trim().is_empty() {
        bail!("after installing nginx and haproxy something listens on :80: {listening}");
    }
    Ok(())
}

/// What booting Debian's kernels under qemu needs (`cargo xtask test --kernel`): qemu,
/// kmod's depmod (virtme-ng indexes the package's modules), udev (virtme-ng finds its
/// virtio-serial ports through it: without it the guest's exit code is lost), busybox for
/// virtme-ng's initramfs, xdp-tools for the libxdp tests that need a guest's kernel.
const GUEST_APT_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "kmod",
    "udev",
    "busybox-static",
    "xdp-tools",
];
/// What `cargo xtask systemd-guest` needs: qemu to boot the guest, mmdebstrap to build its
/// Debian root, e2fsprogs for its disk images (mkfs.ext4 -d) and reading the guest's
/// journal back (debugfs).
const SYSTEMD_GUEST_APT_PACKAGES: &[&str] = &["qemu-system-x86", "mmdebstrap", "e2fsprogs"];

/// The systemd guest's tools (`cargo xtask setup` installs them too). Idempotent.
pub fn systemd_guest() -> Result<()> {
    install_apt(SYSTEMD_GUEST_APT_PACKAGES)
}

/// virtme-ng from PyPI, at the version this harness was written against.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// The guest tools (`cargo xtask setup` installs them too). Idempotent.
pub fn guest() -> Result<()> {
    install_apt(GUEST_APT_PACKAGES)?;
    let have =
        output_ok(Command::new(scripts_dir()?.join("vng")).arg("--version")).is_some_and(|v| {
            v.trim() == format!("virtme-ng {}", VIRTME_NG.trim_start_matches("virtme-ng=="))
        });
    if !have {
        eprintln!("setup: installing {VIRTME_NG} (PyPI)");
        run_cmd(Command::new("python3").args(["-m", "pip", "install", "-q", VIRTME_NG]))
            .context("virtme-ng boots the test guests")?;
    }
    Ok(())
}

/// Where pip puts the scripts of this machine's python3 (vng, virtme-run): not always on
/// PATH (pyenv shims need a rehash), so the harness runs them from here.
pub fn scripts_dir() -> Result<std::path::PathBuf> {
    let dir = output_ok(Command::new("python3").args([
        "-c",
        "import sysconfig; print(sysconfig.get_path('scripts'))",
    ]))
    .context("python3 is missing: virtme-ng needs it")?;
    Ok(std::path::PathBuf::from(dir.trim()))
}

fn output_ok(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nightly_rust_src() -> Result<()> {
    let Some(sysroot) =
        output_ok(Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]))
    else {
        eprintln!("setup: installing the nightly toolchain");
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--component",
            "rustfmt",
        ]))
        .context("the eBPF program needs a nightly toolchain")?;
        return Ok(());
    };
    // rustfmt.toml's import grouping needs nightly rustfmt (CI checks it).
    if output_ok(Command::new("rustup").args(["run", "nightly", "rustfmt", "--version"])).is_none()
    {
        eprintln!("setup: adding rustfmt to nightly");
        run_cmd(Command::new("rustup").args([
            "component",
            "add",
            "rustfmt",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let core_src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core");
    if !core_src.exists() {
        eprintln!("setup: adding rust-src to nightly");
        run_cmd(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    output_ok(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.contains("install ok installed"))
}

fn apt_packages() -> Result<()> {
    install_apt(APT_PACKAGES)
}

fn install_apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing {}", missing.join(" "));
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update (setup needs root and Debian's package registry)")?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn bpf_linker() -> Result<()> {
    if output_ok(Command::new("bpf-linker").arg("--version")).is_some() {
        return Ok(());
    }
    if !Path::new(LLVM_PREFIX).join("lib/libLLVM.so").exists() {
        bail!("{LLVM_PREFIX}/lib/libLLVM.so is missing although llvm-22-dev is installed");
    }
    eprintln!("setup: building bpf-linker against LLVM 22 (about a minute)");
    // bpf-linker's default LLVM feature does not match anything installable here; it
    // must be told where LLVM 22 lives, or it links against a library it cannot find.
    run_cmd(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
            // CI lints the workspace through these (.ci/run); bpf-linker is not ours.
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("RUSTFLAGS"),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn script(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_policy_rc_d_is_used_only_when_it_refuses_both_starts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(start_policy(&d.join("none")), StartPolicy::Absent);
        let cases = [
            ("ours", OUR_POLICY, StartPolicy::Ours),
            // As Docker's Debian images ship it.
            (
                "docker",
                "#!/bin/sh\n# For most Docker users ...\nexit 101\n",
                StartPolicy::RefusesStarts,
            ),
            ("allows", "#!/bin/sh\nexit 0\n", StartPolicy::Other),
            (
                "only-nginx",
                "#!/bin/sh\n[ \"$1\" = nginx ] && exit 101\nexit 104\n",
                StartPolicy::Other,
            ),
        ];
        for (name, text, expected) in cases {
            assert_eq!(start_policy(&script(d, name, text)), expected, "{name}");
        }
    }
}
