//! `cargo xtask systemd-guest`: the Debian packages under a real systemd. The kernel
//! matrix (guest.rs) boots Debian's kernels with virtme-ng, whose init is its own; here
//! the guest is a whole Debian 12 system whose PID 1 is systemd, so the units and the
//! maintainer scripts meet the real `systemctl`, `journalctl` and `deb-systemd-invoke`.
//!
//! The root is built once with mmdebstrap from Debian's packages (its kernel and an
//! initramfs made inside it by initramfs-tools) into an ext4 image under
//! target/systemd-guest/, named by a hash of what went into it, so later runs boot it at
//! once. Each run boots it under qemu with the image as a snapshot (the guest's writes
//! go to a throwaway overlay), and a second disk holding the two .debs, a later version
//! of `limiter` and the script (systemd_guest.sh). A unit baked into the image runs the
//! script after multi-user.target with its output on the second serial port, which is
//! this command's output: one `PASS`/`FAIL` line per step, then `RESULT`. The script
//! writes the guest's journal to the second disk before it powers the guest off.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};

use crate::{run_cmd, workspace_root};

/// The script the guest runs (every step and its checks).
const SCRIPT: &str = include_str!("systemd_guest.sh");

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// What the root holds beyond Debian's `required` set: systemd as init, udev (device
/// units: the payload disk), dbus (systemctl's and systemd-analyze's bus), the kernel and
/// the initramfs tools that give it its virtio modules, and the script's tools: ip (veth,
/// namespaces), ping (the traffic), bpftool (the link), jq (`stats --json`).
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "linux-image-amd64",
    "initramfs-tools",
    "kmod",
    "e2fsprogs",
    "iproute2",
    "iputils-ping",
    "bpftool",
    "jq",
];

const FSTAB: &str = "/dev/vda / ext4 rw,errors=remount-ro 0 1\n";

/// The unit that runs the script: after everything else has started, as an operator
/// would log in; the guest powers off when it ends, whatever happened.
const RUNNER_NAME: &str = "limiter-guest-test.service";
const RUNNER_UNIT: &str = "[Unit]
Description=limiter package test (cargo xtask systemd-guest)
After=multi-user.target dev-vdb.device
Requires=dev-vdb.device

[Service]
Type=oneshot
TimeoutStartSec=infinity
Environment=PAYLOAD=/mnt/payload
ExecStart=/bin/sh -c 'mkdir -p /mnt/payload && mount /dev/vdb /mnt/payload && exec sh /mnt/payload/run.sh >/dev/ttyS1 2>&1'
ExecStopPost=/bin/systemctl --no-block poweroff

[Install]
WantedBy=multi-user.target
";

/// How long a run may take before the guest is killed (the whole script takes about
/// six minutes under TCG on a 2-CPU machine).
const RUN_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// The tools a run needs, with the Debian package of each.
const TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("mmdebstrap", "mmdebstrap"),
    ("mkfs.ext4", "e2fsprogs"),
    ("debugfs", "e2fsprogs"),
    ("dpkg-deb", "dpkg"),
];

/// The boot files and image of one root.
struct Root {
    image: PathBuf,
    vmlinuz: PathBuf,
    initrd: PathBuf,
}

pub fn run(debs: &[PathBuf], rebuild_root: bool) -> Result<()> {
    check_tools()?;
    let dir = workspace_root()?.join("target/systemd-guest");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = Instant::now();
    let root = root(&dir, rebuild_root)?;
    let payload = payload(&dir, debs)?;
    eprintln!(
        "systemd-guest: root ready after {:.0} s; booting it under qemu (TCG)",
        started.elapsed().as_secs_f64()
    );
    let log = dir.join("run.log");
    let lines = boot(&root, &payload, &dir.join("console.log"), &log)?;
    let journal = dir.join("journal.txt");
    let _ = fs::remove_file(&journal);
    let dumped = Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump /journal.txt {}", journal.display()))
        .arg(&payload)
        .output();
    if dumped.is_ok_and(|o| o.status.success()) && journal.exists() {
        eprintln!("systemd-guest: the guest's journal: {}", journal.display());
    }
    eprintln!(
        "systemd-guest: finished in {:.0} s; the script's output: {}, the console: {}",
        started.elapsed().as_secs_f64(),
        log.display(),
        dir.join("console.log").display()
    );
    verdict(&lines)
}

/// What the script's lines say: every step passed and it said `RESULT 0`, or the step
/// that failed.
fn verdict(lines: &[String]) -> Result<()> {
    if let Some(failed) = lines.iter().find(|l| l.starts_with("FAIL ")) {
        bail!("systemd-guest: {failed}");
    }
    let result = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(str::trim);
    match result {
        Some("0") => {
            let passed = lines.iter().filter(|l| l.starts_with("PASS ")).count();
            ensure!(passed > 0, "systemd-guest: RESULT 0 but no step passed");
            eprintln!("systemd-guest: all {passed} steps passed");
            Ok(())
        }
        Some(code) => bail!("systemd-guest: the script ended with RESULT {code}"),
        None => {
            let last = lines.iter().rev().find(|l| l.starts_with("STEP "));
            bail!(
                "systemd-guest: the guest ended without a RESULT line (last {}): it did not \
                 boot, the script died, or the run timed out",
                last.map_or("step: none started", String::as_str)
            )
        }
    }
}

fn check_tools() -> Result<()> {
    for (tool, package) in TOOLS {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ensure!(
            found,
            "{tool} is missing (Debian's {package}): run `cargo xtask setup`"
        );
    }
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { crate::libc_geteuid() } == 0,
        "systemd-guest builds the guest's root with mmdebstrap --mode=root: run it as root"
    );
    Ok(())
}

/// FNV-1a of the inputs: a stable name for a root built from them.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn root_key() -> String {
    let packages = PACKAGES.join(",");
    format!(
        "{:016x}",
        fnv1a(&[SUITE, MIRROR, &packages, FSTAB, RUNNER_NAME, RUNNER_UNIT])
    )
}

/// The cached root for these inputs, built first if missing (or if asked to).
fn root(dir: &Path, rebuild: bool) -> Result<Root> {
    let key = root_key();
    let root = Root {
        image: dir.join(format!("root-{key}.img")),
        vmlinuz: dir.join(format!("vmlinuz-{key}")),
        initrd: dir.join(format!("initrd-{key}")),
    };
    if !rebuild && root.image.exists() && root.vmlinuz.exists() && root.initrd.exists() {
        eprintln!("systemd-guest: reusing {}", root.image.display());
        return Ok(root);
    }
    let tree = dir.join(format!("root-{key}.tree"));
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    eprintln!(
        "systemd-guest: building a Debian {SUITE} root with mmdebstrap from {MIRROR} \
         (downloads about 150 MB; a few minutes)"
    );
    let status = Command::new("mmdebstrap")
        .args(["--mode=root", "--variant=required", "--quiet"])
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&tree)
        .arg(MIRROR)
        .status()
        .context("could not start mmdebstrap")?;
    ensure!(
        status.success(),
        "mmdebstrap failed ({status}): building the root needs Debian's mirror {MIRROR} \
         (network) and root"
    );
    configure(&tree)?;
    let boot = tree.join("boot");
    let find = |prefix: &str| -> Result<PathBuf> {
        fs::read_dir(&boot)
            .with_context(|| format!("reading {}", boot.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && !n.ends_with(".new"))
            })
            .with_context(|| format!("the root has no {}/{prefix}*", boot.display()))
    };
    fs::copy(find("vmlinuz-")?, &root.vmlinuz).context("copying the kernel out")?;
    fs::copy(find("initrd.img-")?, &root.initrd).context("copying the initramfs out")?;
    let tmp = root.image.with_extension("img.tmp");
    let _ = fs::remove_file(&tmp);
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "limiter-guest", "-d"])
            .arg(&tree)
            .arg(&tmp)
            .arg("3G"),
    )
    .context("making the root's ext4 image")?;
    fs::rename(&tmp, &root.image)?;
    fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    Ok(root)
}

/// What mmdebstrap leaves to us: the root's fstab, a hostname, and the runner enabled.
fn configure(tree: &Path) -> Result<()> {
    fs::write(tree.join("etc/fstab"), FSTAB)?;
    fs::write(tree.join("etc/hostname"), "limiter-guest\n")?;
    let unit = tree.join("etc/systemd/system").join(RUNNER_NAME);
    fs::write(&unit, RUNNER_UNIT)?;
    let wants = tree.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    symlink(
        Path::new("/etc/systemd/system").join(RUNNER_NAME),
        wants.join(RUNNER_NAME),
    )
    .context("enabling the runner unit")?;
    Ok(())
}

/// The second disk: the packages, a later version of `limiter` and the script.
fn payload(dir: &Path, debs: &[PathBuf]) -> Result<PathBuf> {
    let tree = dir.join("payload");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    fs::create_dir_all(tree.join("upgrade"))?;
    let mut limiter = None;
    for deb in debs {
        let name = deb.file_name().context("a .deb without a name")?;
        fs::copy(deb, tree.join(name)).with_context(|| format!("copying {}", deb.display()))?;
        if name.to_string_lossy().starts_with("limiter_") {
            limiter = Some(deb);
        }
    }
    let limiter = limiter.context("cargo xtask dist made no limiter_*.deb")?;
    let scratch = dir.join("repack");
    if scratch.exists() {
        fs::remove_dir_all(&scratch)?;
    }
    later_version(limiter, &scratch, &tree.join("upgrade"))?;
    fs::remove_dir_all(&scratch)?;
    fs::write(tree.join("run.sh"), SCRIPT)?;
    let image = dir.join("payload.img");
    let _ = fs::remove_file(&image);
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "limiter-payload", "-d"])
            .arg(&tree)
            .arg(&image)
            .arg("256M"),
    )
    .context("making the payload disk")?;
    Ok(image)
}

/// `deb` rebuilt under its version with `+upgrade1` appended, as the next release of the
/// same binary, into `out`: what `dpkg -i` of a newer build upgrades to.
fn later_version(deb: &Path, scratch: &Path, out: &Path) -> Result<PathBuf> {
    fs::create_dir_all(scratch)?;
    let tree = scratch.join("tree");
    run_cmd(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree))?;
    let control_path = tree.join("DEBIAN/control");
    let control = fs::read_to_string(&control_path)?;
    let (control, version) = bump_version(&control)?;
    fs::write(&control_path, control)?;
    // limiter_VERSION_ARCH.deb: the same name under the later version.
    let name = deb
        .file_name()
        .and_then(|n| n.to_str())
        .context("a .deb without a name")?;
    let arch = name
        .rsplit_once('_')
        .map(|(_, arch)| arch)
        .with_context(|| format!("{name} is not PACKAGE_VERSION_ARCH.deb"))?;
    let path = out.join(format!("limiter_{version}_{arch}"));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "-z1", "--build"])
            .arg(&tree)
            .arg(&path),
    )?;
    Ok(path)
}

/// The control file with `+upgrade1` appended to its version, and that version.
fn bump_version(control: &str) -> Result<(String, String)> {
    let old = control
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .with_context(|| format!("no Version: in the control file:\n{control}"))?;
    let new = format!("{old}+upgrade1");
    Ok((
        control.replace(&format!("Version: {old}\n"), &format!("Version: {new}\n")),
        new,
    ))
}

/// Boots the root with the payload, returns the script's lines (also printed, and
/// written to `log`); the console goes to `console`.
fn boot(root: &Root, payload: &Path, console: &Path, log: &Path) -> Result<Vec<String>> {
    use std::io::Write as _;
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "2"])
        .args([
            "-display",
            "none",
            "-no-reboot",
            "-monitor",
            "none",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(&root.vmlinuz)
        .arg("-initrd")
        .arg(&root.initrd)
        .args([
            "-append",
            "root=/dev/vda rw console=ttyS0 init=/lib/systemd/systemd panic=-1",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,snapshot=on",
            root.image.display()
        ))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", payload.display()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("qemu's stdout")?;
    let mut file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let line = line.trim_end_matches('\r').to_string();
            println!("guest| {line}");
            let _ = writeln!(file, "{line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => lines.push(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() > deadline {
                    timed_out = true;
                    // qemu is our child: killed by its own handle.
                    let _ = child.kill();
                    break;
                }
            }
        }
    }
    let status = child.wait().context("waiting for qemu")?;
    let _ = reader.join();
    lines.extend(rx.try_iter());
    if timed_out {
        bail!(
            "systemd-guest: no end after {} min: killed qemu (last line: {:?}); console in {}",
            RUN_TIMEOUT.as_secs() / 60,
            lines.last(),
            console.display()
        );
    }
    if !status.success() {
        eprintln!("systemd-guest: qemu exited {status}");
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_failed_step_fails_the_run_with_its_message() {
        let err = verdict(&lines(
            "STEP install\nPASS install\nSTEP upgrade\nFAIL upgrade: dropped nothing\nRESULT 1",
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("FAIL upgrade: dropped nothing"),
            "{err}"
        );
    }

    #[test]
    fn only_result_0_with_passed_steps_passes() {
        assert!(verdict(&lines("STEP a\nPASS a\nRESULT 0")).is_ok());
        assert!(verdict(&lines("RESULT 0")).is_err());
        assert!(verdict(&lines("STEP a\nPASS a\nRESULT 1")).is_err());
        let err = verdict(&lines("STEP a\nPASS a\nSTEP b")).unwrap_err();
        assert!(err.to_string().contains("STEP b"), "{err}");
    }

    #[test]
    fn the_upgrade_is_a_later_version() {
        let (control, version) =
            bump_version("Package: limiter\nVersion: 0.1.0\nArchitecture: amd64\n").unwrap();
        assert_eq!(version, "0.1.0+upgrade1");
        assert!(control.contains("Version: 0.1.0+upgrade1\n"), "{control}");
        assert!(bump_version("Package: limiter\n").is_err());
        // dpkg orders it after the version it upgrades.
        let newer = Command::new("dpkg")
            .args(["--compare-versions", &version, "gt", "0.1.0"])
            .status()
            .expect("dpkg (Debian's dpkg) compares the versions");
        assert!(newer.success(), "dpkg orders {version} before 0.1.0");
    }

    #[test]
    fn the_root_key_changes_with_its_inputs() {
        assert_ne!(fnv1a(&["a", "bc"]), fnv1a(&["ab", "c"]));
        assert_eq!(root_key(), root_key());
    }

    #[test]
    fn every_step_of_the_script_reports_pass() {
        // A `step X` with no `pass` after it would end without its PASS line.
        let steps = SCRIPT.lines().filter(|l| l.starts_with("step ")).count();
        let passes = SCRIPT
            .lines()
            .filter(|l| l.trim_start().starts_with("pass"))
            .count();
        assert!(
            steps > 5 && passes >= steps,
            "{steps} steps, {passes} passes"
        );
    }
}
