//! Installs what a fresh machine of this kind lacks. Each step checks first, so a
//! machine that has everything is done in well under a second.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::run_cmd;

/// Debian packages: LLVM 22 for bpf-linker, bpftool for inspecting maps, iproute2 for
/// the tests' namespaces and veth pairs, nftables for the comparison benchmark.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "bpftool",
    "iproute2",
    "nftables",
];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

pub fn run() -> Result<()> {
    nightly_rust_src()?;
    apt_packages()?;
    bpf_linker()?;
    Ok(())
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
        ]))
        .context("the eBPF program needs a nightly toolchain")?;
        return Ok(());
    };
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
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
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
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX),
    )
}
