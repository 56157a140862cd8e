//! `cargo xtask <task>`: the project's own commands. Every task that builds runs `setup`
//! first, so a fresh machine needs nothing but this repository.

mod bench;
mod dist;
mod guest;
mod lanes;
mod setup;
mod sim;
mod systemd_guest;
mod timed_tests;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what this machine lacks: nightly rust-src, LLVM 22, bpf-linker, bpftool,
    /// iproute2, nftables, and for `test --kernel` qemu, virtme-ng, udev, xdp-tools, and
    /// for `systemd-guest` mmdebstrap and e2fsprogs.
    /// Idempotent; quick when everything is present.
    Setup,
    /// Build the XDP program and the `limiter` binary (release).
    Build,
    /// Build, then run the daemon: `cargo xtask run -- --config F --iface IF`. With no
    /// arguments: a self-contained lab (namespace, veth pair, example config, traffic,
    /// live table) until Ctrl-C; `-- --lab-lb [--duration S]`: the same lab with the
    /// limiter in front of a stand-in load balancer (tail-call handoff); `-- --fleet
    /// [--duration S] [--script "5:kill,20:restart"]`: the fleet lab (three allocator
    /// replicas on one etcd, three daemons, a live view of their shares and states and the
    /// replicas' roles, keys to kill the leader, restart the killed replicas and partition
    /// a host).
    Run {
        /// Arguments for `limiter run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The dress rehearsal (root): three LB namespaces (nftables NAT ×2, HAProxy) in
    /// front of nginx backends, the limiter on each in fleet mode with three allocator
    /// replicas on etcd, wrk/curl clients, hping3/wrk attackers, a fault a minute on a
    /// seeded schedule; a baseline first. Writes report.md, CSVs and plots into `--out`,
    /// prints PASS/FAIL lines, exits non-zero on a FAIL (docs/soak.md).
    Soak {
        /// Minutes with the limiter, attacks and faults (after the baseline).
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// Seed of the fault schedule and the attacks' targets.
        #[arg(long, default_value_t = 36)]
        seed: u64,
        /// Where the report goes.
        #[arg(long, default_value = "soak-report")]
        out: std::path::PathBuf,
        /// Minutes after it with the limiters detached and nftables guarding the LBs
        /// (0: none; limiter-soak's default: 1).
        #[arg(long)]
        nft_minutes: Option<u64>,
        /// Seconds of baseline (no attack, no limiter; limiter-soak's default: 5 s a
        /// minute, 60 s to 5 minutes).
        #[arg(long)]
        baseline_s: Option<u64>,
    },
    /// Run every test: host unit/property tests, then the kernel tests (root). With
    /// `--kernel`, the kernel tests also (or only) run on Debian's kernels under qemu;
    /// `-- FILE [FILTER...]` runs one test file of tests/tests/ (`daemon` for
    /// tests/tests/daemon.rs) only.
    Test {
        /// Where: `host` (this machine's kernel, the default), `6.1` (Debian 12),
        /// `6.12` (its backport), an exact package version such as `6.1.0-57`, or `all`
        /// (host, 6.1 and 6.12); comma-separated.
        #[arg(long, value_delimiter = ',')]
        kernel: Vec<String>,
        /// How qemu runs a guest: `auto` uses KVM when a probe boot shows it works.
        #[arg(long, value_enum, default_value_t = guest::Accel::Auto)]
        accel: guest::Accel,
        /// Which suites a guest runs: `full` (every suite of the guest matrix: check a
        /// kernel-side change on it) or `kernel` (only those whose outcome the kernel
        /// decides: CI's 6.1 leg). See `KERNEL_DEPENDENT` in xtask/src/guest.rs.
        #[arg(long, value_enum, default_value_t = guest::Matrix::Full)]
        matrix: guest::Matrix,
        /// Build everything the selected runs need (binaries, test executables, guest
        /// kernels) and run nothing: CI times the build apart from the tests.
        #[arg(long)]
        no_run: bool,
        /// A test file and test-name filters.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        selection: Vec<String>,
    },
    /// BPF_PROG_TEST_RUN cost per frame against a trivial XDP program, then the
    /// end-to-end figures (a benchmark); `-- PART...` runs some parts only. With
    /// `--kernel`, runs in a guest of that Debian kernel under qemu instead (figures under
    /// TCG emulation: compare ratios of the same run, never nanoseconds).
    Bench {
        /// A Debian kernel (`6.1`, `6.12`, a package version), as for `test --kernel`.
        #[arg(long)]
        kernel: Option<String>,
        #[arg(long, value_enum, default_value_t = guest::Accel::Auto)]
        accel: guest::Accel,
        /// Parts of limiter-bench: prog-test-run, sharing, drop-rate, cpu-cost, accuracy,
        /// flood, allocator-capacity.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        parts: Vec<String>,
    },
    /// The evasion fuzz test (tests/tests/evasion.rs) with as many cases as you like:
    /// random header stacks, fragments, options and chains through every build of the
    /// program, checked against a model of what a receiving stack delivers (root).
    Fuzz {
        /// Cases per build (attacks; single frames get ten times as many).
        #[arg(long, default_value_t = 5000)]
        cases: u64,
        /// Seed of the generator (default: a fresh one, printed).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Build the release binaries (if not built), then the Debian packages `limiter` and
    /// `limiter-allocator` into target/dist/ (dpkg-deb): binaries, systemd units, configs
    /// under /etc/limiter/, man pages, shell completions, README.
    Dist {
        /// Package the binaries in target/release as they are, without asking cargo
        /// (tests/package.rs: the suite built them, and a build with other packages
        /// selected can unify features differently and relink them).
        #[arg(long)]
        no_build: bool,
    },
    /// The Debian packages under a real systemd: boots a Debian 12 guest whose PID 1 is
    /// systemd (root built once with mmdebstrap, cached under target/systemd-guest/;
    /// qemu, TCG) and there installs, enables, reloads, kill -9s, detaches, stops,
    /// upgrades under traffic, removes and purges them with the real systemctl and
    /// journalctl, one PASS or FAIL line a step (root; docs/testing.md).
    SystemdGuest {
        /// Build the guest's root again even if the cached image is there.
        #[arg(long)]
        rebuild_root: bool,
    },
    /// Fleet simulator in virtual time (500 hosts, the fleet's failure cases in
    /// docs/design.md); writes
    /// target/sim/report.md. Needs no root or eBPF. `cargo xtask sim -- --help` for options.
    Sim {
        /// Arguments for the simulator.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup => {
            setup::run()?;
            setup::guest()?;
            setup::systemd_guest()
        }
        Task::Build => {
            setup::run()?;
            build()
        }
        Task::Run { args } => {
            setup::run()?;
            build()?;
            let release = workspace_root()?.join("target/release");
            let (binary, args) = run_target(&args);
            run_cmd(Command::new(release.join(binary)).args(args))
        }
        Task::Soak {
            minutes,
            seed,
            out,
            nft_minutes,
            baseline_s,
        } => {
            setup::run()?;
            build()?;
            let release = workspace_root()?.join("target/release");
            let mut soak = Command::new(release.join("limiter-soak"));
            soak.args([
                "--minutes",
                &minutes.to_string(),
                "--seed",
                &seed.to_string(),
            ])
            .arg("--out")
            .arg(out);
            if let Some(n) = nft_minutes {
                soak.args(["--nft-minutes", &n.to_string()]);
            }
            if let Some(s) = baseline_s {
                soak.args(["--baseline-s", &s.to_string()]);
            }
            run_cmd(&mut soak)
        }
        Task::Test {
            kernel,
            accel,
            matrix,
            no_run,
            selection,
        } => {
            setup::run()?;
            let targets = if kernel.is_empty() {
                vec![guest::Target::Host]
            } else {
                guest::targets(&kernel)?
            };
            if targets.iter().any(|t| matches!(t, guest::Target::Guest(_))) {
                setup::guest()?;
            }
            // Every target runs, so one failing kernel does not hide another's result.
            let mut failed = Vec::new();
            for target in &targets {
                let (name, result) = match target {
                    guest::Target::Host => ("host".to_string(), test(&selection, no_run)),
                    guest::Target::Guest(k) => {
                        (k.clone(), guest::run(k, accel, matrix, &selection, no_run))
                    }
                };
                if let Err(e) = result {
                    eprintln!("test: {name}: {e:#}");
                    failed.push(name);
                }
            }
            if !failed.is_empty() {
                bail!("tests failed on: {}", failed.join(", "));
            }
            Ok(())
        }
        Task::Bench {
            kernel,
            accel,
            parts,
        } => {
            setup::run()?;
            match kernel {
                None => bench::run(&parts),
                Some(kernel) => {
                    setup::guest()?;
                    guest::bench(&kernel, accel, &parts)
                }
            }
        }
        Task::Dist { no_build } => {
            setup::run()?;
            if !no_build {
                build()?;
            }
            dist::run().map(drop)
        }
        Task::SystemdGuest { rebuild_root } => {
            setup::run()?;
            setup::systemd_guest()?;
            build()?;
            let debs = dist::run()?;
            systemd_guest::run(&debs, rebuild_root)
        }
        Task::Sim { args } => sim::run(&args),
        Task::Fuzz { cases, seed } => {
            setup::run()?;
            let mut cmd = cargo();
            cmd.args([
                "test",
                "--release",
                "-p",
                "limiter-tests",
                "--test",
                "evasion",
                "--",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("LIMITER_FUZZ_CASES", cases.to_string());
            if let Some(seed) = seed {
                cmd.env("LIMITER_FUZZ_SEED", seed.to_string());
            }
            run_cmd(&mut cmd)
        }
    }
}

pub fn workspace_root() -> Result<PathBuf> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    Path::new(&manifest)
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // What `cargo run` set for xtask itself, not for the builds it starts: cargo records
    // the environment that build scripts watch (ring's watches CARGO_MANIFEST_DIR), so a
    // build under `cargo xtask` and one by hand (`cargo test`, `cargo clippy`) took each
    // other's build-script runs as stale and rebuilt ring, rustls, tonic and every crate
    // of ours, each time one followed the other.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&key)
        {
            cmd.env_remove(key);
        }
    }
    if let Ok(root) = workspace_root() {
        cmd.current_dir(root);
    }
    cmd
}

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// The binaries `run` and `dist` start, without the tests (`cargo xtask test` builds
/// them with [`build_with_tests`]): limiter-tests finds them in target/release/ (cargo
/// builds other packages' binaries for no test of it).
fn build() -> Result<()> {
    run_cmd(cargo().args([
        "build",
        "--release",
        "--package",
        "limiter-user",
        "--package",
        "limiter-bench",
        "--package",
        "limiter-allocator",
        "--bin",
        "limiter",
        "--bin",
        "limiter-lab",
        "--bin",
        "limiter-fleet-lab",
        "--bin",
        "limiter-soak",
        "--bin",
        "limiter-allocator",
    ]))
}

/// The binaries the end-to-end tests run and the test executables of `tests` (cargo's
/// target selection: `--tests`, `--test FILE`, `--test *`), in one cargo invocation, so
/// that both are built with one feature unification: built apart (`build` without the
/// tests' dev-dependencies, then `cargo test`), serde_json, regex-syntax, getrandom and
/// every crate of ours above them were compiled twice, once per feature set. The
/// features the dev-dependencies add (getrandom's std, regex's unicode tables,
/// serde_json's `unbounded_depth` method, semver's serde) do not change what the
/// binaries do. `--message-format=json` for callers that need the
/// executables' paths; its stdout is returned.
pub fn build_with_tests(tests: &[&str], json: bool) -> Result<String> {
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--bins"]).args(tests);
    if !json {
        run_cmd(&mut cmd)?;
        return Ok(String::new());
    }
    cmd.arg("--message-format=json")
        .stderr(std::process::Stdio::inherit());
    let out = cmd
        .output()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn test(selection: &[String], no_run: bool) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if !no_run && unsafe { libc_geteuid() } != 0 {
        bail!(
            "the kernel tests load XDP programs and create network namespaces: \
             run `cargo xtask test` as root"
        );
    }
    if let Some((file, filters)) = selection.split_first() {
        // Checked, not passed on: `-p` would unify features differently from the full
        // run's and rebuild half the dependency tree.
        guest::test_file(file)?;
        // The binaries the end-to-end tests run (`limiter`, `limiter-lab`,
        // `limiter-allocator`) and this file's executable.
        let exes = guest::test_executables(&build_with_tests(&["--test", file], true)?);
        if no_run {
            return Ok(());
        }
        let (dir, _, exe) = exes
            .iter()
            .find(|(_, name, _)| name == file)
            .with_context(|| format!("cargo built no test executable named {file}"))?;
        let (passed, timings) =
            timed_tests::run(exe, file, dir, filters, timed_tests::Output::Live)?;
        println!("\n{}", timed_tests::table(&timings, 10));
        if !passed {
            bail!("test target {file} failed");
        }
        return Ok(());
    }
    build_with_tests(&["--tests"], false)?;
    if no_run {
        return Ok(());
    }
    // Every step runs even after a failure (`--no-fail-fast`, and each kernel test
    // executable in turn): a CI run should report every failure, not the first.
    let steps: [&[&str]; 2] = [
        // Unit and property tests of pure logic first: they run in parallel.
        &["test", "--release", "--no-fail-fast", "--lib", "--bins"],
        &["test", "--release", "--no-fail-fast", "--doc"],
    ];
    let mut failed: Vec<String> = steps
        .iter()
        .filter_map(|args| run_cmd(cargo().args(*args)).err())
        .map(|e| format!("{e:#}"))
        .collect();
    // The kernel tests, each executable's tests one at a time, each test's time kept for
    // the table at the end; the executables in the lanes `lanes::plan` gives.
    let mut exes = guest::test_executables(&build_with_tests(&["--test", "*"], true)?);
    exes.sort();
    type Exe = (std::path::PathBuf, String, std::path::PathBuf);
    let run = |lane: &[(&Exe, &lanes::Part)], output: timed_tests::Output| {
        let mut timings = Vec::new();
        let mut failed = Vec::new();
        for ((dir, file, exe), part) in lane {
            match timed_tests::run(exe, file, dir, &part.args, output) {
                Ok((passed, t)) => {
                    if let Err(e) = lanes::check_light_parts(part, t.len()) {
                        failed.push(format!("{e:#}"));
                    }
                    timings.extend(t);
                    if !passed {
                        failed.push(format!("test target {} failed", part.label()));
                    }
                }
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        (timings, failed)
    };
    let files: Vec<&str> = exes.iter().map(|(_, f, _)| f.as_str()).collect();
    let plan = lanes::plan(&files);
    // In the plan's order.
    fn pick<'e, 'p>(
        exes: &'e [Exe],
        parts: &'p [lanes::Part<'p>],
    ) -> Vec<(&'e Exe, &'p lanes::Part<'p>)> {
        parts
            .iter()
            .filter_map(|part| {
                exes.iter()
                    .find(|(_, f, _)| f == part.file)
                    .map(|exe| (exe, part))
            })
            .collect()
    }
    let (waiting, priority, busy, alone) = (
        pick(&exes, &plan.waiting),
        pick(&exes, &plan.priority),
        pick(&exes, &plan.busy),
        pick(&exes, &plan.alone),
    );
    let labels = |parts: &[lanes::Part]| {
        parts
            .iter()
            .map(lanes::Part::label)
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "\nxtask: {} test files in three lanes side by side (beside the others: {}; at nice \
         {}: {}), then {} that need the CPUs to themselves, one at a time ({})",
        waiting.len() + priority.len() + busy.len(),
        labels(&plan.waiting),
        lanes::PRIORITY_NICE,
        labels(&plan.priority),
        alone.len(),
        labels(&plan.alone)
    );
    let mut timings = Vec::new();
    std::thread::scope(|scope| {
        // Each file's output whole when it ends, so that the lanes do not interleave.
        let beside = scope.spawn(|| run(&waiting, timed_tests::Output::Whole));
        let prioritised = scope.spawn(|| match lanes::set_thread_nice(lanes::PRIORITY_NICE) {
            Ok(()) => run(&priority, timed_tests::Output::Whole),
            Err(e) => (Vec::new(), vec![format!("{e:#}")]),
        });
        let (t, f) = run(&busy, timed_tests::Output::Whole);
        timings.extend(t);
        failed.extend(f);
        for (lane, name) in [(beside, "waiting"), (prioritised, "priority")] {
            match lane.join() {
                Ok((t, f)) => {
                    timings.extend(t);
                    failed.extend(f);
                }
                Err(_) => failed.push(format!("the {name} lane's thread panicked")),
            }
        }
    });
    if let Some(pid) = lanes::alone_after()? {
        lanes::wait_for_exit(pid, lanes::ALONE_WAIT_MAX);
    }
    let (t, f) = run(&alone, timed_tests::Output::Live);
    timings.extend(t);
    failed.extend(f);
    println!("\n{}", timed_tests::table(&timings, 25));
    if !failed.is_empty() {
        bail!("host tests failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    pub(crate) fn libc_geteuid() -> u32;
}

/// What `cargo xtask run -- ARGS` starts: a lab, or the daemon. Every lab takes
/// `--duration S` the same way: `run -- --duration 30` is the single-host lab for 30 s,
/// not `limiter run --duration` (which has no such option).
fn run_target(args: &[String]) -> (&'static str, Vec<String>) {
    let rest = |n: usize| args.iter().skip(n).cloned().collect::<Vec<_>>();
    match args.first().map(String::as_str) {
        // The single-host lab (`--lab` names it when flags follow).
        None => ("limiter-lab", Vec::new()),
        Some("--lab") => ("limiter-lab", rest(1)),
        Some("--duration") => ("limiter-lab", rest(0)),
        // The same lab in front of a stand-in load balancer (tail-call handoff).
        Some("--lab-lb") => {
            let mut lab = vec!["--lb".to_string()];
            lab.extend(rest(1));
            ("limiter-lab", lab)
        }
        // Three allocator replicas and three daemons, a live view.
        Some("--fleet") => ("limiter-fleet-lab", rest(1)),
        Some(_) => {
            let mut run = vec!["run".to_string()];
            run.extend(rest(0));
            ("limiter", run)
        }
    }
}

#[cfg(test)]
mod run_tests {
    use super::run_target;

    fn target(args: &str) -> (&'static str, String) {
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        let (binary, args) = run_target(&args);
        (binary, args.join(" "))
    }

    #[test]
    fn every_lab_takes_duration_and_the_rest_goes_to_limiter_run() {
        assert_eq!(target(""), ("limiter-lab", String::new()));
        assert_eq!(
            target("--duration 30"),
            ("limiter-lab", "--duration 30".into())
        );
        assert_eq!(
            target("--lab --duration 30"),
            ("limiter-lab", "--duration 30".into())
        );
        assert_eq!(
            target("--lab-lb --duration 30"),
            ("limiter-lab", "--lb --duration 30".into())
        );
        assert_eq!(
            target("--fleet --duration 30"),
            ("limiter-fleet-lab", "--duration 30".into())
        );
        assert_eq!(
            target("--config F --iface eth1"),
            ("limiter", "run --config F --iface eth1".into())
        );
    }
}
