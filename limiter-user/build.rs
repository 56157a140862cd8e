//! Builds the XDP program (limiter-ebpf) with the nightly toolchain and bpf-linker and
//! leaves it in OUT_DIR for `include_bytes_aligned!`.
//!
//! The same job as aya-build, with one difference that matters: `-C target-cpu=v3`, which
//! the BPF backend needs to emit the fetching atomics (BPF_CMPXCHG) the meters rely on.
//! aya-build sets RUSTFLAGS itself and has no way to add it. `cargo xtask setup` installs
//! what this needs (nightly rust-src, bpf-linker).

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

/// (binary of limiter-ebpf, object file in OUT_DIR)
const OBJECTS: [(&str, &str); 4] = [
    ("limiter", "limiter.bpf.o"),
    ("baseline", "baseline.bpf.o"),
    ("dispatcher", "dispatcher.bpf.o"),
    ("standin_lb", "standin_lb.bpf.o"),
];

fn main() {
    if let Err(e) = run() {
        // A build script has only this channel; the message names the missing piece.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR not set")?);
    let workspace = manifest_dir
        .parent()
        .ok_or("limiter-user has no parent directory")?;

    println!("cargo::rerun-if-env-changed=LIMITER_EBPF_SKIP");
    if env::var_os("LIMITER_EBPF_SKIP").is_some_and(|v| v == "1") {
        // For editing pure modules without the BPF toolchain: the daemon will refuse to
        // load this empty object with a clear error.
        println!("cargo::warning=LIMITER_EBPF_SKIP=1: building without the XDP program");
        for (_, object) in OBJECTS {
            let object = out_dir.join(object);
            fs::write(&object, b"").map_err(|e| format!("writing {}: {e}", object.display()))?;
        }
        return Ok(());
    }
    for dir in ["limiter-ebpf/src", "limiter-common/src"] {
        println!("cargo::rerun-if-changed={}", workspace.join(dir).display());
    }
    for file in [
        "limiter-ebpf/Cargo.toml",
        "limiter-common/Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo::rerun-if-changed={}", workspace.join(file).display());
    }

    // Shared by every build of this profile (OUT_DIR is <target>/<profile>/build/<pkg>/out),
    // so the program and its `core` are compiled once, not once per OUT_DIR.
    let target_dir = out_dir
        .ancestors()
        .nth(3)
        .map_or_else(|| out_dir.join("ebpf-target"), |p| p.join("ebpf-target"));
    let rustflags = ["-Cdebuginfo=2", "-Clink-arg=--btf", "-Ctarget-cpu=v3"].join("\x1f");
    let mut cmd = Command::new("rustup");
    cmd.current_dir(workspace)
        .args([
            "run",
            "nightly",
            "cargo",
            "build",
            "--package",
            "limiter-ebpf",
        ])
        .args(["--bins", "--release", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    // The outer cargo's settings are for the host build, not this one.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
        "CARGO_MAKEFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().map_err(|e| {
        format!("could not run `rustup run nightly cargo` ({e}); run `cargo xtask setup` first")
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("bpf-linker") && stderr.contains("not found") {
            "\nbpf-linker is missing: run `cargo xtask setup`"
        } else {
            ""
        };
        return Err(format!("building the XDP program failed:\n{stderr}{hint}"));
    }
    for (bin, object) in OBJECTS {
        let built = target_dir.join("bpfel-unknown-none/release").join(bin);
        copy(&built, &out_dir.join(object))?;
    }
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}
