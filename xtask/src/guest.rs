//! `cargo xtask test --kernel VERSION`: the kernel tests on Debian's kernels, booted under
//! qemu.
//!
//! LB fleets run distribution kernels, not this machine's. Each guest boots a kernel
//! taken from Debian's package (`linux-image-*-amd64-unsigned`, downloaded and unpacked
//! under target/kernels/, never installed into /boot) with virtme-ng: the guest sees this
//! machine's filesystem read-only, so it runs the test binaries built here, with the
//! tools installed here (bpftool, iproute2, xdp-tools), against its own kernel. Only
//! target/guest/ is writable from inside: each run leaves its log and a result file there.
//!
//! Why virtme-ng and not an init of our own: it is Debian-independent, on PyPI, and
//! solves what an own init would have to (loading the package's virtio and 9p modules
//! from an initramfs, sharing the root, tmpfs over /tmp and /run, returning the
//! command's exit code over virtio-serial), which leaves this module only the choice of
//! kernel and tests.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, run_cmd, workspace_root};

/// One test file of tests/tests/ and the tests of it a guest runs (none listed: all of
/// them).
pub struct Suite {
    pub file: &'static str,
    pub filters: &'static [&'static str],
}

/// What every guest runs: the verdict tables and the truncation sweep on every build, the
/// daemon's attach, restart and adoption tests, one end-to-end rate test per mode, the TC
/// filter tests (the only TC hook before 6.6), a deliberately broken build refused by
/// the verifier while the running one keeps enforcing, and the kernel report (what
/// loads, verifier instructions, load time). An emulated guest moves
/// 15–20 k frames/s, so the rate tests it runs are the ones that scale to that.
pub const MATRIX: &[Suite] = &[
    Suite {
        file: "kernel_report",
        filters: &[],
    },
    Suite {
        file: "verdicts",
        filters: &[],
    },
    Suite {
        file: "e2e",
        filters: &[
            "native_mode_enforces_the_rate",
            "generic_mode_enforces_the_rate",
            "tc_mode_enforces_the_rate",
            "jumbo_mtu_runs_the_multi_buffer_build",
            "maps_are_pinned_with_btf",
        ],
    },
    Suite {
        file: "daemon",
        filters: &[
            "kill_9_mid_traffic_then_restart_never_opens_a_gap",
            "tc_mode_survives_kill_9_and_adopts_its_link",
            "upgrade_through_the_pinned_link_loses_nothing",
            "pinned_maps_of_another_layout_are_refused",
        ],
    },
    Suite {
        file: "ownership",
        filters: &[
            "detach_removes_only_the_limiters_pins",
            "a_foreign_object_at_a_link_pin_is_refused_not_replaced",
            "links_of_interfaces_dropped_from_the_config_are_detached_at_start",
        ],
    },
    Suite {
        file: "tc_filters",
        filters: &[],
    },
    Suite {
        file: "verifier",
        filters: &[],
    },
    Suite {
        file: "libxdp",
        filters: &[],
    },
    Suite {
        file: "sharing",
        filters: &[],
    },
    Suite {
        file: "start_rollback",
        filters: &["a_failed_start_in_a_libxdp_dispatcher_leaves_the_host_as_it_was"],
    },
    Suite {
        file: "privilege",
        filters: &[
            "native_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities",
            "generic_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities",
            "tc_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities",
            "libxdp_sharing_without_cap_sys_admin_is_refused_naming_it",
            "libxdp_sharing_with_the_units_capabilities_and_cap_sys_admin",
            "without_any_one_of_them_start_fails_naming_it_and_changes_nothing",
        ],
    },
    Suite {
        file: "handoff_test_run",
        filters: &[],
    },
    Suite {
        file: "handoff_daemon",
        filters: &[
            "join_program_array_root_calls_the_limiter_which_calls_the_lb",
            "kill_9_and_restart_under_traffic_keep_every_pass_going_to_the_lb",
            "next_program_slot_uses_the_lbs_array_so_a_replacement_applies_at_once",
        ],
    },
    Suite {
        file: "tunnels",
        filters: &[],
    },
];

/// What CI runs on Debian 6.1 (`cargo xtask test --kernel 6.1 --matrix kernel`): the
/// suites of [`MATRIX`] whose outcome the kernel decides. Under TCG every daemon start
/// costs the verifier's ~15 s, so the rest of [`MATRIX`] — the same code paths on every
/// kernel — runs on this machine's kernel in CI and in the guests with `--matrix full`
/// (the default, and `--kernel all`), which is what a kernel-side change is checked on.
/// Left out here: `verdicts` (the program's own parsing and metering through
/// BPF_PROG_TEST_RUN: the same instructions on every kernel once the verifier accepts
/// them, which `kernel_report` checks for every build), `ownership` (which pins and links
/// are the limiter's: bpffs and link-info calls older than 6.1), the handoff tests beyond
/// the first join (the daemon's bookkeeping of the LB's array), `daemon`'s
/// pinned-layout check (map info, unchanged since 4.x), the `privilege` tests of
/// libxdp's CAP_SYS_ADMIN (covered where freplace is, by `sharing`) and `sharing`'s
/// refusal of a program that is not a dispatcher (a name read back).
/// `every_kernel_suite_is_in_the_full_matrix` keeps this a subset of [`MATRIX`].
pub const KERNEL_DEPENDENT: &[Suite] = &[
    // Every build through this kernel's verifier, every mode attached, the kernel-feature
    // checks (`kernel::check`: frags, tcx or cls_bpf, freplace) and their report.
    Suite {
        file: "kernel_report",
        filters: &[],
    },
    // One rate test per attach mode (native and generic bpf_link, TC through cls_bpf
    // without tcx), the multi-buffer build on frags (MTU 9000), maps pinned with BTF.
    Suite {
        file: "e2e",
        filters: &[
            "native_mode_enforces_the_rate",
            "generic_mode_enforces_the_rate",
            "tc_mode_enforces_the_rate",
            "jumbo_mtu_runs_the_multi_buffer_build",
            "maps_are_pinned_with_btf",
        ],
    },
    // Adoption after kill -9 of a pinned bpf_link and of a cls_bpf filter, and
    // BPF_LINK_UPDATE for an upgrade: the kernel's link semantics.
    Suite {
        file: "daemon",
        filters: &[
            "kill_9_mid_traffic_then_restart_never_opens_a_gap",
            "tc_mode_survives_kill_9_and_adopts_its_link",
            "upgrade_through_the_pinned_link_loses_nothing",
        ],
    },
    // The only TC hook before 6.6: cls_bpf filters under clsact, next to others.
    Suite {
        file: "tc_filters",
        filters: &[],
    },
    // A build this kernel's verifier refuses, while the running one keeps enforcing.
    Suite {
        file: "verifier",
        filters: &[],
    },
    // libxdp's dispatcher as this kernel's libxdp installs it (freplace).
    Suite {
        file: "libxdp",
        filters: &[],
    },
    // Sharing the hook through freplace, which this machine's kernel refuses: these tests
    // run only in guests (and the last one takes the branch where libxdp installs its
    // dispatcher). Not `a_program_that_is_not_a_dispatcher_is_named_and_left_alone`: a
    // program's name read back, which the host's run checks.
    Suite {
        file: "sharing",
        filters: &[
            "the_limiter_joins_xdp_filter_and_both_enforce",
            "each_side_unloads_without_stopping_the_other",
            "kill_9_restart_and_upgrade_keep_both_enforcing",
            "xdp_filter_joins_the_dispatcher_the_limiter_installed",
            "where_freplace_is_refused_the_operator_is_told_what_to_do",
        ],
    },
    // A failed start undone in libxdp's dispatcher (freplace, refused here).
    Suite {
        file: "start_rollback",
        filters: &["a_failed_start_in_a_libxdp_dispatcher_leaves_the_host_as_it_was"],
    },
    // What each mode needs of the unit's capabilities, which the kernel decides (CAP_BPF,
    // CAP_NET_ADMIN, CAP_PERFMON on 6.1): an XDP bpf_link and a cls_bpf filter. Not
    // generic mode's: its link is the native one's with another flag, created, read back
    // and replaced by the same kernel code under the same checks (≈ 38 s of emulated
    // starts in CI's guest; the full matrix runs it).
    Suite {
        file: "privilege",
        filters: &[
            "native_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities",
            "tc_mode_starts_and_restarts_over_its_own_attachment_with_the_units_capabilities",
            "without_any_one_of_them_start_fails_naming_it_and_changes_nothing",
        ],
    },
    // Tail calls between the builds and an LB's program: prog array compatibility
    // (frags flags, program types) is the kernel's check.
    Suite {
        file: "handoff_test_run",
        filters: &[],
    },
    Suite {
        file: "handoff_daemon",
        filters: &["join_program_array_root_calls_the_limiter_which_calls_the_lb"],
    },
    // A real tunnel device terminating what the program decapsulates: this machine's
    // kernel has no tunnel drivers, Debian's build them as modules.
    Suite {
        file: "tunnels",
        filters: &[],
    },
];

/// Which suites a guest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Matrix {
    /// Every suite of [`MATRIX`].
    Full,
    /// The kernel-dependent ones ([`KERNEL_DEPENDENT`]): CI's 6.1 leg.
    Kernel,
}

impl Matrix {
    fn suites(self) -> &'static [Suite] {
        match self {
            Matrix::Full => MATRIX,
            Matrix::Kernel => KERNEL_DEPENDENT,
        }
    }
}

/// One test file to run in a guest, with the filters to pass it (none: every test).
struct Run {
    file: String,
    filters: Vec<String>,
}

impl From<&Suite> for Run {
    fn from(s: &Suite) -> Run {
        Run {
            file: s.file.to_string(),
            filters: s.filters.iter().map(|f| f.to_string()).collect(),
        }
    }
}

/// A Debian kernel the matrix knows by a short name.
struct KnownKernel {
    name: &'static str,
    /// apt-cache's `--names-only` pattern of its packages; the newest one is taken.
    pattern: &'static str,
}

/// Debian 12's kernel and its backport. The newest package of each line is taken: a
/// pinned ABI number would vanish from the archive within months.
const KNOWN: &[KnownKernel] = &[
    KnownKernel {
        name: "6.1",
        pattern: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
    },
    KnownKernel {
        name: "6.12",
        pattern: r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$",
    },
];

/// Where a kernel runs: this machine, or a guest booting a package.
pub enum Target {
    Host,
    Guest(String),
}

/// `--kernel` values: `host`, a known short name (`6.1`, `6.12`), a package's version part
/// (`6.1.0-57`, `6.12.117+deb12`), or `all`; comma-separated.
pub fn targets(spec: &[String]) -> Result<Vec<Target>> {
    let mut out = Vec::new();
    for s in spec {
        match s.as_str() {
            "host" => out.push(Target::Host),
            "all" => {
                out.push(Target::Host);
                out.extend(KNOWN.iter().map(|k| Target::Guest(k.name.to_string())));
            }
            other if !other.is_empty() => out.push(Target::Guest(other.to_string())),
            _ => bail!(
                "--kernel: an empty value (known: host, all, {})",
                known_names()
            ),
        }
    }
    Ok(out)
}

fn known_names() -> String {
    KNOWN.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// How qemu runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// KVM if a probe boot shows it works, else TCG (software emulation).
    Auto,
    Kvm,
    Tcg,
}

/// An unpacked kernel package.
struct Kernel {
    package: String,
    vmlinuz: PathBuf,
    release: String,
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The package name for `name`: the newest of a known line, or the exact package of a
/// version part.
fn resolve_package(name: &str) -> Result<String> {
    let pattern = match KNOWN.iter().find(|k| k.name == name) {
        Some(k) => k.pattern.to_string(),
        None => {
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+-".contains(c))
            {
                bail!(
                    "--kernel {name:?}: not a kernel version (known: host, all, {})",
                    known_names()
                );
            }
            format!("^linux-image-{}-amd64-unsigned$", regex_escape(name))
        }
    };
    let search = |pattern: &str| -> Result<Vec<String>> {
        Ok(
            output(Command::new("apt-cache").args(["search", "--names-only", pattern]))?
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect(),
        )
    };
    let mut found = search(&pattern)?;
    if found.is_empty() {
        // A fresh machine's package lists may be empty or old.
        run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
        found = search(&pattern)?;
    }
    found.sort_by_key(|p| version_key(p));
    found.pop().with_context(|| {
        format!(
            "no Debian kernel package matches {pattern} (apt-cache search --names-only); \
             known names: {}",
            known_names()
        )
    })
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '.' | '+' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

/// Orders package names by the numbers in them (6.1.0-9 before 6.1.0-57).
fn version_key(package: &str) -> Vec<u64> {
    package
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Downloads and unpacks `package` under target/kernels/ (once).
fn unpack(package: &str) -> Result<Kernel> {
    let root = workspace_root()?.join("target/kernels");
    let dir = root.join(package);
    let done = dir.join(".unpacked");
    if !done.exists() {
        fs::create_dir_all(&root)?;
        eprintln!("guest: downloading {package} (Debian's package, about 100 MB)");
        // apt drops privileges to _apt for the download; a directory it cannot write
        // makes it warn and download as root, which is what runs here anyway.
        run_cmd(
            Command::new("apt-get")
                .args(["download", "-qq", package])
                .current_dir(&root),
        )
        .with_context(|| format!("downloading {package}"))?;
        let deb = fs::read_dir(&root)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
            .with_context(|| {
                format!(
                    "apt-get download left no {package}_*.deb in {}",
                    root.display()
                )
            })?;
        let _ = fs::remove_dir_all(&dir);
        run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
        fs::remove_file(&deb)?;
        fs::write(&done, "")?;
    }
    let boot = dir.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("{} has no boot/", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{package} has no boot/vmlinuz-*"))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_string();
    let modules = dir.join("lib/modules").join(&release);
    for module in [
        "kernel/drivers/net/veth.ko",
        "kernel/net/9p/9pnet_virtio.ko",
    ] {
        let m = modules.join(module);
        let xz = m.with_extension("ko.xz");
        if !m.exists() && !xz.exists() {
            bail!(
                "{package} lacks the module {} the guest needs ({})",
                module,
                m.display()
            );
        }
    }
    Ok(Kernel {
        package: package.to_string(),
        vmlinuz,
        release,
    })
}

/// Test executables of `runs`, built here (release), by file.
/// (package directory, test target name, executable) of every test target.
pub type TestExe = (PathBuf, String, PathBuf);

fn build_tests(runs: &[Run]) -> Result<Vec<TestExe>> {
    // The binaries the suites run (`limiter`, `limiter-lab`, `limiter-allocator`), found in
    // target/release/, and every test target of the workspace, as `cargo xtask test`
    // builds them: the same features, so the same artifacts (a narrower `-p` selection
    // would unify features differently and rebuild half the dependency tree).
    let out = crate::build_with_tests(&["--test", "*"], true)?;
    let found = test_executables(&out);
    let dir = tests_package_dir()?;
    for s in runs {
        if !found.iter().any(|(d, n, _)| *d == dir && *n == s.file) {
            bail!(
                "cargo built no test executable for {TESTS_PACKAGE}'s tests/{}.rs",
                s.file
            );
        }
    }
    Ok(found)
}

/// Every test target's executable in the JSON messages of a cargo build.
pub fn test_executables(cargo_json: &str) -> Vec<TestExe> {
    let mut found = Vec::new();
    for line in cargo_json.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name), Some(kinds), Some(manifest)) = (
            msg["executable"].as_str(),
            msg["target"]["name"].as_str(),
            msg["target"]["kind"].as_array(),
            msg["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let dir = Path::new(manifest)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if kinds.iter().any(|k| k == "test") {
            found.push((dir, name.to_string(), PathBuf::from(exe)));
        }
    }
    found
}

/// The package of every end-to-end test file.
const TESTS_PACKAGE: &str = "limiter-tests";

/// Its directory (its tests run from there, as under cargo).
fn tests_package_dir() -> Result<PathBuf> {
    Ok(workspace_root()?.join("tests"))
}

/// Files that touch what libxdp keeps for the whole kernel (its dispatcher's pins under
/// /sys/fs/bpf/xdp, which some of their checks require empty, and xdp-loader's view of
/// an interface): they run one after another, in the guest's first lane.
const LIBXDP_STATE: &[&str] = &["libxdp", "sharing", "start_rollback", "privilege"];

/// Files that run in the first lane too, with [`LIBXDP_STATE`], to even the lanes out
/// (CI's 6.1 leg beside the host suite, issue 32: the libxdp files ≈ 314 s and
/// `handoff_test_run` ≈ 48 s; the second lane's `kernel_report`, `daemon`, `tc_filters`,
/// `tunnels` and `handoff_daemon` ≈ 330–380 s once `tunnels` verified only the build it
/// attaches, 135 s before).
const FIRST_LANE_TOO: &[&str] = &["handoff_test_run"];

/// Files that run after both lanes, one at a time: their rate checks model the bucket
/// from the sender's timestamps, which hold only while XDP runs as the frames are sent.
/// Beside the other lane, the native rate test passed 2.66 % more than its model (5,904
/// against 5,751): the veth's receive side ran late, so the bucket refilled through what
/// the sender saw as a stall. `verifier`'s check that the running program still enforces
/// after a refused start read 5,469 frames passed where its rate allows at least 5,806
/// (3 % below rate × span), beside the other lane while the host ran three lanes.
const GUEST_ALONE: &[&str] = &["e2e", "verifier"];

/// Where a file runs in the guest: lane 0 or 1, or 2 (alone, after both).
fn lane(file: &str) -> usize {
    if GUEST_ALONE.contains(&file) {
        2
    } else if LIBXDP_STATE.contains(&file) || FIRST_LANE_TOO.contains(&file) {
        0
    } else {
        1
    }
}

/// The shell script the guest runs: every suite, one test at a time within a file, in
/// two lanes side by side (the guest has two vCPUs, and most of a test's time under
/// emulation is one CPU verifying a program or sending frames), then [`GUEST_ALONE`]'s
/// one at a time; all run even when one fails; the exit code says whether all passed.
/// Each file's output is kept in its own log and printed whole, in the suites' order,
/// at the end, with a line on the console as each file ends.
fn script(runs: &[Run], exes: &[TestExe], out: &Path) -> Result<String> {
    let mut s = String::from(
        "#!/bin/sh\n# Written by `cargo xtask test --kernel`; runs inside the guest.\n",
    );
    // RUSTC_BOOTSTRAP: each test's time (crate::timed_tests).
    s.push_str("export RUST_BACKTRACE=0 LIMITER_IN_GUEST=1 RUSTC_BOOTSTRAP=1\n");
    s.push_str(&format!(
        "export LIMITER_GUEST_OUT={}\n",
        sh_quote(&out.display().to_string())
    ));
    // bpffs where systemd mounts it on the hosts this runs on (libxdp's tools need it;
    // the daemon would mount it itself).
    s.push_str("[ \"$(stat -f -c %T /sys/fs/bpf)\" = bpf_fs ] || mount -t bpf bpf /sys/fs/bpf\n");
    s.push_str("echo \"guest: $(uname -r) ($(uname -v)), $(nproc) CPUs, two lanes\"\n");
    // suite FILE DIR EXE ARGS...: runs one file, its output to FILE.log, its exit code to
    // FILE.rc.
    s.push_str(
        "suite() {\n\
         \x20   file=$1; dir=$2; shift 2\n\
         \x20   t0=$(date +%s)\n\
         \x20   (cd \"$dir\" && \"$@\") >\"$LIMITER_GUEST_OUT/$file.log\" 2>&1\n\
         \x20   rc=$?\n\
         \x20   echo \"$rc\" >\"$LIMITER_GUEST_OUT/$file.rc\"\n\
         \x20   echo \"guest: $file ended in $(( $(date +%s) - t0 )) s (exit $rc)\"\n\
         }\n",
    );
    let dir = tests_package_dir()?;
    let mut lanes: [Vec<String>; 3] = Default::default();
    for run in runs {
        let exe = exes
            .iter()
            .find(|(d, n, _)| *d == dir && *n == run.file)
            .map(|(_, _, p)| p)
            .with_context(|| format!("no executable for {}", run.file))?;
        // Tests that need what this machine's kernel lacks (freplace) are #[ignore]d on
        // the host and run here.
        let args: Vec<String> = ["--test-threads=1", "--include-ignored"]
            .into_iter()
            .chain(crate::timed_tests::REPORT_TIME)
            .chain(run.filters.iter().map(String::as_str))
            .map(sh_quote)
            .collect();
        lanes[lane(&run.file)].push(format!(
            "    suite {file} {dir} {exe} {args}\n",
            file = sh_quote(&run.file),
            dir = sh_quote(&dir.display().to_string()),
            exe = sh_quote(&exe.display().to_string()),
            args = args.join(" "),
        ));
    }
    let [first, second, alone] = lanes;
    for lane in [first, second].iter().filter(|l| !l.is_empty()) {
        s.push_str("(\n");
        s.push_str(&lane.concat());
        s.push_str(") &\n");
    }
    s.push_str("wait\n");
    s.push_str(&alone.concat());
    s.push_str("failed=0\n");
    for run in runs {
        s.push_str(&format!(
            "echo; echo \"guest: == {file}\"; cat \"$LIMITER_GUEST_OUT/{file}.log\"\n\
             [ \"$(cat \"$LIMITER_GUEST_OUT/{file}.rc\" 2>/dev/null)\" = 0 ] || failed=1\n",
            file = run.file,
        ));
    }
    s.push_str("echo \"$failed\" > \"$LIMITER_GUEST_OUT/result\"\nexit $failed\n");
    Ok(s)
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What a fresh machine lacks to boot guests: a missing tool is a failure that says what
/// to install, never a skip.
fn check_tools() -> Result<()> {
    for (tool, from) in [
        ("qemu-system-x86_64", "Debian's qemu-system-x86"),
        ("depmod", "Debian's kmod"),
        ("dpkg-deb", "Debian's dpkg"),
        ("apt-get", "Debian's apt"),
    ] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            bail!("{tool} is missing ({from}): run `cargo xtask setup`");
        }
    }
    if !crate::setup::scripts_dir()?.join("vng").exists() {
        bail!("vng is missing (virtme-ng from PyPI): run `cargo xtask setup`");
    }
    // virtme-ng returns the guest's exit code over virtio-serial ports it finds through
    // udev's /dev/virtio-ports names; without udevd every run "fails" with 255.
    if !Path::new("/lib/systemd/systemd-udevd").exists()
        && !Path::new("/usr/lib/systemd/systemd-udevd").exists()
    {
        bail!("systemd-udevd is missing (Debian's udev): the guest cannot return its exit code; run `cargo xtask setup`");
    }
    Ok(())
}

/// Boots `kernel` with `out` writable, runs `script` in it (logged to
/// `out/guest.log`) and returns vng's exit status.
fn boot(
    kernel: &Kernel,
    accel: Accel,
    out: &Path,
    script: &Path,
) -> Result<std::process::ExitStatus> {
    run_logged(
        vng(
            kernel,
            accel,
            out,
            &format!("sh {}", sh_quote(&script.display().to_string())),
        )?,
        &out.join("guest.log"),
    )
}

fn vng(kernel: &Kernel, accel: Accel, rwdir: &Path, exec: &str) -> Result<Command> {
    let scripts = crate::setup::scripts_dir()?;
    let mut cmd = Command::new(scripts.join("vng"));
    // vng starts virtme-run, which lives beside it.
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", scripts.display()));
    cmd.arg("-r").arg(&kernel.vmlinuz);
    if accel == Accel::Tcg {
        cmd.arg("--disable-kvm");
    }
    cmd.args(["--user", "root", "--memory", "3G", "--cpus", "2"])
        .arg("--rwdir")
        .arg(rwdir)
        .arg("--exec")
        .arg(exec)
        .stdin(Stdio::null());
    Ok(cmd)
}

/// KVM where it works: a guest that boots and echoes within 30 s. On this project's
/// VMs /dev/kvm exists (kvm_pvm) but a KVM guest hangs before its first line, so the
/// probe's answer is kept per host kernel in target/guest/kvm-probe.
fn choose_accel(requested: Accel, kernel: &Kernel) -> Result<Accel> {
    if requested == Accel::Tcg {
        return Ok(Accel::Tcg);
    }
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        if requested == Accel::Kvm {
            bail!("--accel kvm: /dev/kvm is missing (no KVM on this machine); use --accel tcg");
        }
        eprintln!("guest: /dev/kvm is missing: TCG emulation");
        return Ok(Accel::Tcg);
    }
    let host = output(Command::new("uname").arg("-r"))?.trim().to_string();
    let dir = workspace_root()?.join("target/guest");
    fs::create_dir_all(&dir)?;
    let cache = dir.join("kvm-probe");
    let cached = fs::read_to_string(&cache).ok().and_then(|s| {
        let (h, v) = s.trim().split_once(' ')?;
        (h == host).then(|| v == "works")
    });
    let works = match cached {
        Some(w) => w,
        None => {
            eprintln!("guest: probing KVM (a guest that must echo within 30 s)");
            let works = probe_kvm(kernel, &dir)?;
            fs::write(
                &cache,
                format!("{host} {}\n", if works { "works" } else { "fails" }),
            )?;
            works
        }
    };
    match (works, requested) {
        (true, _) => Ok(Accel::Kvm),
        (false, Accel::Kvm) => bail!(
            "--accel kvm: a KVM guest did not boot within 30 s on this machine \
             ({} says so; delete it to probe again); use --accel tcg",
            cache.display()
        ),
        (false, _) => {
            eprintln!(
                "guest: KVM does not boot a guest here ({}): TCG emulation",
                cache.display()
            );
            Ok(Accel::Tcg)
        }
    }
}

fn probe_kvm(kernel: &Kernel, dir: &Path) -> Result<bool> {
    use std::os::unix::process::CommandExt as _;
    // A process group of its own: vng is a script that starts virtme-run, which starts
    // qemu, so killing vng alone would leave a hung qemu spinning (it did, through a
    // whole guest run) after the probe gave up on it.
    let mut child = vng(kernel, Accel::Kvm, dir, "echo limiter-kvm-probe-ok")?
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting vng")?;
    let stdout = child.stdout.take().context("vng's stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ok = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("limiter-kvm-probe-ok"));
        let _ = tx.send(ok);
    });
    let ok = rx.recv_timeout(Duration::from_secs(30)).unwrap_or(false);
    // The guest and qemu are ours: the whole group goes, by its id (vng's pid).
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
    Ok(ok)
}

/// Runs `cmd` with its output copied to ours and to `log`. Through pipes: qemu opens its
/// console files itself (`/proc/self/fd/1`), which would truncate a file that our
/// stdout redirects to, and lose what was written before.
fn run_logged(mut cmd: Command, log: &Path) -> Result<std::process::ExitStatus> {
    use std::io::Write as _;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting vng")?;
    let file = std::sync::Arc::new(std::sync::Mutex::new(
        fs::File::create(log).with_context(|| format!("creating {}", log.display()))?,
    ));
    let mut copiers = Vec::new();
    let stdout = child.stdout.take().context("vng's stdout")?;
    let stderr = child.stderr.take().context("vng's stderr")?;
    for (reader, to_stderr) in [
        (Box::new(stdout) as Box<dyn std::io::Read + Send>, false),
        (Box::new(stderr), true),
    ] {
        let file = file.clone();
        copiers.push(std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                if to_stderr {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
                if let Ok(mut f) = file.lock() {
                    let _ = writeln!(f, "{line}");
                }
            }
        }));
    }
    let status = child.wait().context("waiting for vng")?;
    for c in copiers {
        let _ = c.join();
    }
    Ok(status)
}

/// Runs the matrix (or, with `selection`, the named test file and filters) in a guest of
/// `name`'s kernel.
pub fn run(
    name: &str,
    accel: Accel,
    matrix: Matrix,
    selection: &[String],
    no_run: bool,
) -> Result<()> {
    check_tools()?;
    let runs: Vec<Run> = match selection.split_first() {
        None => matrix.suites().iter().map(Run::from).collect(),
        Some((file, filters)) => vec![Run {
            file: test_file(file)?,
            filters: filters.to_vec(),
        }],
    };
    let exes = build_tests(&runs)?;
    let package = resolve_package(name)?;
    let kernel = unpack(&package)?;
    if no_run {
        return Ok(());
    }
    let out = workspace_root()?.join("target/guest").join(&kernel.release);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let script_path = out.join("run.sh");
    fs::write(&script_path, script(&runs, &exes, &out)?)?;
    let accel = choose_accel(accel, &kernel)?;
    eprintln!(
        "guest: {} ({}) under {}, {} test file(s); log in {}",
        kernel.release,
        kernel.package,
        match accel {
            Accel::Kvm => "KVM",
            _ => "TCG emulation",
        },
        runs.len(),
        out.display()
    );
    let started = Instant::now();
    let status = boot(&kernel, accel, &out, &script_path)?;
    let result = fs::read_to_string(out.join("result")).ok();
    eprintln!(
        "guest: {} finished in {:.0} s ({status})",
        kernel.release,
        started.elapsed().as_secs_f64()
    );
    match result.as_deref().map(str::trim) {
        Some("0") if status.success() => Ok(()),
        Some("0") => bail!(
            "the {} guest passed its tests but vng exited {status}",
            kernel.release
        ),
        Some(_) => bail!(
            "tests failed in the {} guest (output above)",
            kernel.release
        ),
        None => bail!(
            "the {} guest ended ({status}) without writing {}: it did not boot or was killed",
            kernel.release,
            out.join("result").display()
        ),
    }
}

/// `cargo xtask bench --kernel K -- PART...`: limiter-bench in a guest of kernel `K`,
/// its report written to `target/guest/<release>-bench/` (the guest's only writable
/// place) and printed.
pub fn bench(name: &str, accel: Accel, parts: &[String]) -> Result<()> {
    check_tools()?;
    let package = resolve_package(name)?;
    let kernel = unpack(&package)?;
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--package",
        "limiter-bench",
        "--bin",
        "limiter-bench",
    ]);
    run_cmd(&mut cmd)?;
    let root = workspace_root()?;
    let exe = root.join("target/release/limiter-bench");
    let out = root
        .join("target/guest")
        .join(format!("{}-bench", kernel.release));
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let quoted: Vec<String> = parts.iter().map(|p| sh_quote(p)).collect();
    let script = format!(
        "#!/bin/sh\n# Written by `cargo xtask bench --kernel`; runs inside the guest.\n\
         export LIMITER_IN_GUEST=1 LIMITER_BENCH_DIR={out}\n\
         [ \"$(stat -f -c %T /sys/fs/bpf)\" = bpf_fs ] || mount -t bpf bpf /sys/fs/bpf\n\
         echo \"guest: $(uname -r) ($(uname -v))\"\n\
         cd {root} && {exe} {parts}\necho $? > {out}/result\n",
        out = sh_quote(&out.display().to_string()),
        root = sh_quote(&root.display().to_string()),
        exe = sh_quote(&exe.display().to_string()),
        parts = quoted.join(" "),
    );
    let script_path = out.join("bench.sh");
    fs::write(&script_path, script)?;
    let accel = choose_accel(accel, &kernel)?;
    eprintln!(
        "guest: benchmark on {} under {}; report in {}",
        kernel.release,
        match accel {
            Accel::Kvm => "KVM",
            _ => "TCG emulation (compare ratios, not nanoseconds)",
        },
        out.display()
    );
    let status = boot(&kernel, accel, &out, &script_path)?;
    match fs::read_to_string(out.join("result"))
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("0") => Ok(()),
        Some(code) => bail!(
            "limiter-bench failed in the {} guest (exit {code})",
            kernel.release
        ),
        None => bail!(
            "the {} guest ended ({status}) without writing {}",
            kernel.release,
            out.join("result").display()
        ),
    }
}

/// `file` if tests/tests/`file`.rs exists (the test target's name), else an error naming
/// where it was looked for.
pub fn test_file(file: &str) -> Result<String> {
    let path = tests_package_dir()?
        .join("tests")
        .join(format!("{file}.rs"));
    if !path.exists() {
        bail!(
            "no test file {} (end-to-end tests live in {TESTS_PACKAGE}'s tests/; \
             name one without .rs, e.g. `daemon`)",
            path.display()
        );
    }
    Ok(file.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_order_by_their_numbers() {
        let mut p = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-47-amd64-unsigned",
        ];
        p.sort_by_key(|p| version_key(p));
        assert_eq!(p.last(), Some(&"linux-image-6.1.0-57-amd64-unsigned"));
    }

    #[test]
    fn every_kernel_suite_is_in_the_full_matrix() {
        // `--kernel all` (the full matrix) must run everything CI's leg runs.
        for k in KERNEL_DEPENDENT {
            let full = MATRIX
                .iter()
                .find(|s| s.file == k.file)
                .unwrap_or_else(|| panic!("{} is not in MATRIX", k.file));
            assert!(
                full.filters.is_empty()
                    || (!k.filters.is_empty()
                        && k.filters.iter().all(|f| full.filters.contains(f))),
                "{}: KERNEL_DEPENDENT runs tests MATRIX does not",
                k.file
            );
        }
    }

    #[test]
    fn the_files_touching_libxdps_state_share_a_lane() {
        // Two of them at once would see each other's dispatcher under /sys/fs/bpf/xdp.
        let dir = tests_package_dir().unwrap_or_default();
        for s in MATRIX {
            let file = dir.join("tests").join(format!("{}.rs", s.file));
            let text =
                fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if text.contains("LibxdpState") || text.contains("/sys/fs/bpf/xdp") {
                assert!(
                    LIBXDP_STATE.contains(&s.file),
                    "{} touches libxdp's state: list it in LIBXDP_STATE",
                    s.file
                );
            }
        }
        for f in LIBXDP_STATE.iter().chain(FIRST_LANE_TOO) {
            assert!(MATRIX.iter().any(|s| s.file == *f), "{f} is not in MATRIX");
            assert_eq!(lane(f), 0, "{f}");
        }
        for f in GUEST_ALONE {
            assert!(MATRIX.iter().any(|s| s.file == *f), "{f} is not in MATRIX");
            assert!(
                !LIBXDP_STATE.contains(f) && !FIRST_LANE_TOO.contains(f),
                "{f}"
            );
        }
    }

    #[test]
    fn every_suite_names_tests_that_exist() {
        // A filter that matches nothing would run no test and pass.
        let dir = tests_package_dir().unwrap_or_default();
        for s in MATRIX.iter().chain(KERNEL_DEPENDENT) {
            let file = dir.join("tests").join(format!("{}.rs", s.file));
            let text =
                fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            for f in s.filters {
                // A test function, or a row of `limiter_tests::test_rows!` (`name =>`).
                let row = text
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{f} =>")));
                assert!(
                    text.contains(&format!("fn {f}(")) || row,
                    "{}: no test {f}",
                    file.display()
                );
            }
        }
    }
}
