//! The Debian packages `cargo xtask dist` builds, checked with Debian's own tools: lintian
//! finds no error or warning; `dpkg -i` installs both packages on this machine without
//! enabling anything, `systemd-analyze verify` accepts the installed units, the man pages
//! render, the completions load (bash registers them, zsh and fish parse them), an
//! operator's edit of a conffile and the enable link survive a reinstall and an upgrade,
//! and `dpkg --purge` leaves nothing behind (a guard purges even when the test fails).
//! Root (dpkg). Each missing tool is a failure that names its Debian package.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

const PACKAGES: [&str; 2] = ["limiter", "limiter-allocator"];
/// The conffile each package installs, as its unit's ExecStart= reads it.
const CONFFILES: [&str; 2] = ["/etc/limiter/limiter.toml", "/etc/limiter/allocator.toml"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("could not start {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails naming the Debian package when `tool` is not on PATH.
fn require(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    assert!(
        found,
        "{tool} is missing: `cargo xtask setup` installs it (apt-get install {package})"
    );
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "installing packages needs root"
    );
}

/// The two .debs, built once per run by `cargo xtask dist --no-build` from the release
/// binaries the other end-to-end tests run (`cargo build --release` first).
fn debs() -> &'static [PathBuf] {
    static DEBS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DEBS.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        run_ok(
            Command::new(cargo)
                .args(["xtask", "dist", "--no-build"])
                .current_dir(root()),
        );
        let version = run_ok(Command::new(root().join("target/release/limiter")).arg("--version"));
        let version = version.trim().strip_prefix("limiter ").unwrap().to_string();
        let arch = run_ok(Command::new("dpkg").arg("--print-architecture"));
        PACKAGES
            .iter()
            .map(|p| {
                let deb = root().join(format!("target/dist/{p}_{version}_{}.deb", arch.trim()));
                assert!(deb.is_file(), "cargo xtask dist made no {}", deb.display());
                deb
            })
            .collect()
    })
}

#[test]
fn lintian_finds_no_error_or_warning() {
    require("lintian", "lintian");
    let debs = debs();
    // Info and pedantic tags are shown, not fatal; those the packages accept are
    // overridden, with the reason, in dist/debian/*.lintian-overrides.
    let out = run(Command::new("lintian")
        .args(["--fail-on", "error,warning", "--display-info"])
        .args(debs));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lintian failed ({}):\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for line in said.lines() {
        assert!(
            !line.starts_with("E: ") && !line.starts_with("W: "),
            "lintian: {line}"
        );
    }
}

/// Purges both packages when dropped, so a failing test leaves the machine as it was.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let out = Command::new("dpkg").arg("--purge").args(PACKAGES).output();
        if let Ok(out) = out {
            if !out.status.success() {
                eprintln!(
                    "package test: dpkg --purge failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

fn installed(package: &str) -> bool {
    let out = run(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]));
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok installed")
}

const WANTS: &str = "/etc/systemd/system/multi-user.target.wants";

#[test]
fn packages_install_without_enabling_verify_and_purge_cleanly() {
    require_root();
    for (tool, package) in [
        ("dpkg", "dpkg"),
        ("systemd-analyze", "systemd"),
        ("systemctl", "systemd"),
        ("man", "man-db"),
        ("bash", "bash"),
        ("zsh", "zsh"),
        ("fish", "fish"),
    ] {
        require(tool, package);
    }
    let debs = debs();
    for package in PACKAGES {
        // Never purge an install the test did not make.
        assert!(
            !installed(package),
            "{package} is installed on this machine already: the test installs and \
             purges it, so remove it first (dpkg --purge {package})"
        );
        assert!(
            !Path::new("/usr/bin").join(package).exists(),
            "/usr/bin/{package} exists outside the package: the test would remove it"
        );
    }
    assert!(
        !Path::new("/etc/limiter").exists(),
        "/etc/limiter exists already: the test must not purge an operator's configs"
    );

    let guard = Installed;
    run_ok(Command::new("dpkg").arg("-i").args(debs));
    let mut files = Vec::new();
    for package in PACKAGES {
        assert!(
            installed(package),
            "{package} is not installed after dpkg -i"
        );
        let listed = run_ok(Command::new("dpkg").args(["-L", package]));
        files.extend(listed.lines().map(PathBuf::from));
    }

    // Installed, never enabled: the operator edits the config first.
    for package in PACKAGES {
        let link = Path::new(WANTS).join(format!("{package}.service"));
        assert!(
            !link.exists(),
            "installing enabled {package}: {}",
            link.display()
        );
    }

    // The conffiles: registered as such, and where the units read them.
    for (package, conffile) in PACKAGES.iter().zip(CONFFILES) {
        let registered =
            run_ok(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", package]));
        assert!(
            registered.contains(conffile),
            "{package}: {conffile} is not a conffile: {registered:?}"
        );
        let unit = fs::read_to_string(format!("/lib/systemd/system/{package}.service")).unwrap();
        let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
        assert!(
            exec.starts_with(&format!("ExecStart=/usr/bin/{package} "))
                && exec.contains(&format!("--config {conffile}")),
            "{package}.service: {exec}"
        );
        // Documentation= points at files the packages install.
        for doc in unit
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation="))
            .flat_map(str::split_whitespace)
            .filter_map(|d| d.strip_prefix("file://"))
        {
            assert!(
                Path::new(doc).is_file(),
                "{package}.service: Documentation={doc} is not installed"
            );
        }
    }

    // The operator's Grafana dashboard and Prometheus rules, as in the repository, owned
    // by the limiter package; the rules' unit tests pass where they are installed.
    for (repo, shipped) in [
        (
            "dist/grafana/limiter.json",
            "/usr/share/limiter/grafana/limiter.json",
        ),
        (
            "dist/prometheus/limiter.rules.yml",
            "/usr/share/limiter/prometheus/limiter.rules.yml",
        ),
        (
            "dist/prometheus/limiter.rules.test.yml",
            "/usr/share/limiter/prometheus/limiter.rules.test.yml",
        ),
    ] {
        assert_eq!(
            fs::read(shipped).ok(),
            Some(fs::read(root().join(repo)).unwrap()),
            "{shipped} is not {repo}"
        );
        let owner = run_ok(Command::new("dpkg").args(["-S", shipped]));
        assert!(owner.starts_with("limiter: "), "{shipped}: {owner}");
    }
    require("promtool", "prometheus");
    run_ok(
        Command::new("promtool")
            .args(["test", "rules", "limiter.rules.test.yml"])
            .current_dir("/usr/share/limiter/prometheus"),
    );

    // systemd accepts the units as installed (ExecStart= binaries present), offline,
    // without a warning.
    let units: Vec<String> = PACKAGES
        .iter()
        .map(|p| format!("/lib/systemd/system/{p}.service"))
        .collect();
    let verify = run(Command::new("systemd-analyze").arg("verify").args(&units));
    let complaints = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify {units:?}: {}\n{complaints}",
        verify.status
    );

    for package in PACKAGES {
        let bin = format!("/usr/bin/{package}");
        // The installed binary is the release build it was made from.
        let built = root().join("target/release").join(package);
        assert_eq!(
            run_ok(Command::new(&bin).arg("--version")),
            run_ok(Command::new(built).arg("--version")),
            "{bin} --version"
        );

        // The man pages: found by name, rendered without a groff warning.
        let page = run_ok(Command::new("man").args(["-w", package]));
        assert_eq!(page.trim(), format!("/usr/share/man/man8/{package}.8.gz"));
        let sub_page = run_ok(Command::new("man").args(["-w", &format!("{package}-run")]));
        assert!(sub_page.contains(&format!("{package}-run.8")), "{sub_page}");
        let rendered = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(page.trim())
            .env("MANWIDTH", "80")
            .env_remove("MAN_KEEP_FORMATTING"));
        let text = String::from_utf8_lossy(&rendered.stdout);
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(
            rendered.status.success() && warnings.trim().is_empty(),
            "man -l {}: {warnings}",
            page.trim()
        );
        assert!(
            text.contains("SYNOPSIS") && text.contains("completions"),
            "{text}"
        );

        // The completions: bash registers them, and they are what the binary says now.
        let bash = format!("/usr/share/bash-completion/completions/{package}");
        let registered = run_ok(
            Command::new("bash")
                .arg("-c")
                .arg(format!("source {bash} && complete -p {package}")),
        );
        assert!(
            registered.contains(&format!("-F _{} {package}", package.replace('-', "__"))),
            "{registered}"
        );
        assert_eq!(
            fs::read_to_string(&bash).unwrap(),
            run_ok(Command::new(&bin).args(["completions", "bash"]))
        );
        for file in [
            format!("/usr/share/zsh/vendor-completions/_{package}"),
            format!("/usr/share/fish/vendor_completions.d/{package}.fish"),
        ] {
            let script = fs::read_to_string(&file).unwrap();
            assert!(script.contains(package), "{file}: {script}");
        }
        // zsh and fish parse them (syntax only: -n / --no-execute run nothing).
        run_ok(
            Command::new("zsh")
                .arg("-n")
                .arg(format!("/usr/share/zsh/vendor-completions/_{package}")),
        );
        run_ok(Command::new("fish").arg("--no-execute").arg(format!(
            "/usr/share/fish/vendor_completions.d/{package}.fish"
        )));
        let readme = format!("/usr/share/doc/{package}/README.md");
        assert!(Path::new(&readme).is_file(), "{readme}");
        // The pages the README links to, beside it as in the repository: every docs/*.md.
        let mut pages = 0;
        for entry in fs::read_dir(root().join("docs")).unwrap() {
            let page = entry.unwrap().path();
            if page.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let name = page.file_name().unwrap().to_string_lossy().into_owned();
            let shipped = format!("/usr/share/doc/{package}/docs/{name}");
            assert_eq!(
                fs::read_to_string(&shipped).ok(),
                Some(fs::read_to_string(&page).unwrap()),
                "{shipped} is not docs/{name}"
            );
            pages += 1;
        }
        assert!(pages > 1, "docs/ holds {pages} pages");

        // The config file's page, in section 5, rendered without a groff warning.
        let config_page = run_ok(Command::new("man").args(["-w", &format!("{package}.toml")]));
        assert_eq!(
            config_page.trim(),
            format!("/usr/share/man/man5/{package}.toml.5.gz")
        );
        let rendered = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(config_page.trim())
            .env("MANWIDTH", "80")
            .env_remove("MAN_KEEP_FORMATTING"));
        let text = String::from_utf8_lossy(&rendered.stdout);
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(
            rendered.status.success() && warnings.trim().is_empty(),
            "man -l {}: {warnings}",
            config_page.trim()
        );
        assert!(
            text.contains("lease_ttl_ms") && text.contains("applies at: restart"),
            "{text}"
        );
    }

    // An operator's edit survives reinstalling (what an upgrade does to a conffile the
    // package did not change).
    let edited = "# edited by the operator\n";
    let mut config = fs::read_to_string(CONFFILES[0]).unwrap();
    config.insert_str(0, edited);
    fs::write(CONFFILES[0], &config).unwrap();
    run_ok(Command::new("dpkg").arg("-i").args(debs));
    assert!(
        fs::read_to_string(CONFFILES[0])
            .unwrap()
            .starts_with(edited),
        "reinstalling overwrote the operator's {}",
        CONFFILES[0]
    );

    // The operator enables the daemon (offline here: PID 1 is not systemd); an upgrade
    // keeps that and the edit, and purge removes the link too.
    run_ok(Command::new("systemctl").args(["enable", "limiter.service"]));
    assert!(Path::new(WANTS).join("limiter.service").exists());

    // An upgrade: the same package under a later version, as `apt upgrade` installs it.
    let scratch = tempfile::tempdir().unwrap();
    let newer = repackage_with_later_version(&debs[0], scratch.path());
    let before = package_version("limiter");
    run_ok(Command::new("dpkg").arg("-i").arg(&newer.0));
    assert_eq!(
        package_version("limiter"),
        newer.1,
        "dpkg -i of {} did not upgrade from {before}",
        newer.0.display()
    );
    assert!(
        fs::read_to_string(CONFFILES[0])
            .unwrap()
            .starts_with(edited),
        "upgrading overwrote the operator's {}",
        CONFFILES[0]
    );
    assert!(
        Path::new(WANTS).join("limiter.service").exists(),
        "upgrading disabled limiter.service"
    );
    run_ok(Command::new("/usr/bin/limiter").arg("--version"));

    run_ok(Command::new("dpkg").arg("--purge").args(PACKAGES));
    drop(guard);
    for package in PACKAGES {
        assert!(!installed(package), "{package} still installed after purge");
        assert!(
            !Path::new(WANTS).join(format!("{package}.service")).exists(),
            "purge left the enable link of {package}.service"
        );
    }
    let left: Vec<&PathBuf> = files.iter().filter(|f| f.is_file()).collect();
    assert!(left.is_empty(), "purge left files: {left:?}");
    for dir in [
        "/etc/limiter",
        "/usr/share/doc/limiter",
        "/usr/share/doc/limiter-allocator",
        "/usr/share/limiter",
    ] {
        assert!(!Path::new(dir).exists(), "purge left {dir}");
    }
}

/// The installed version of `package` (dpkg-query).
fn package_version(package: &str) -> String {
    run_ok(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]))
}

/// `deb` unpacked and built again with `+upgrade1` appended to its version: a later
/// version of the same package (path, version).
fn repackage_with_later_version(deb: &Path, scratch: &Path) -> (PathBuf, String) {
    let tree = scratch.join("tree");
    run_ok(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree));
    let control_path = tree.join("DEBIAN/control");
    let control = fs::read_to_string(&control_path).unwrap();
    let old = control
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .unwrap_or_else(|| panic!("no Version in {control}"))
        .to_string();
    let version = format!("{old}+upgrade1");
    fs::write(
        &control_path,
        control.replace(
            &format!("Version: {old}\n"),
            &format!("Version: {version}\n"),
        ),
    )
    .unwrap();
    let out = scratch.join("upgraded.deb");
    run_ok(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&tree)
            .arg(&out),
    );
    (out, version)
}
