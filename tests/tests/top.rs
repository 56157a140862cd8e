//! `limiter top` as an operator sees it: the real binary in a real terminal (a tmux pane
//! on a server of the test's own), over a daemon enforcing on a veth pair with traffic
//! over the limit. The screen's rates match what was offered and what the rule lets
//! through; a canary's mode cell says its percentage; `t` shows the totals `limiter
//! stats` reads, a canary's split into dropped and would-drop; `q` and SIGTERM leave the
//! terminal as they found it, exit status 0; a terminal that hangs up ends it. And
//! `limiter-lab` in a terminal runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use common::{join, Lab, LIMITER};
use limiter_tests::{
    binaries::LIMITER_LAB, frame::with_ipv4_src, scenario::udp_to_host, traffic::SendPlan,
};

const RATE: u64 = 2_000;
const OFFERED: u64 = 10_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A tmux server of this test's own (its own socket, `-L`), with one session in a
/// 120×40 terminal running `command`; the server is killed by its socket name on drop.
struct Pane {
    socket: String,
}

impl Pane {
    fn start(command: &str) -> Pane {
        let present = Command::new("tmux").arg("-V").output();
        assert!(
            present.is_ok_and(|o| o.status.success()),
            "tmux is missing: these tests run `limiter top` in a tmux pane (cargo xtask \
             setup installs it: apt-get install -y tmux)"
        );
        let socket = format!(
            "limiter-top-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let pane = Pane { socket };
        let out = pane
            .tmux()
            .args(["new-session", "-d", "-s", "top", "-x", "120", "-y", "40"])
            .arg(command)
            .output()
            .expect("running tmux");
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pane
    }

    fn tmux(&self) -> Command {
        let mut cmd = Command::new("tmux");
        // No user config: the pane is the same on every machine.
        cmd.args(["-L", &self.socket, "-f", "/dev/null"]);
        cmd
    }

    fn output(&self, args: &[&str]) -> String {
        let out = self.tmux().args(args).output().expect("running tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.output(&["capture-pane", "-p", "-t", "top"])
    }

    fn keys(&self, keys: &str) {
        self.output(&["send-keys", "-t", "top", keys]);
    }

    /// Waits (bounded) for a screen `ready` accepts; returns it.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} on the screen after 15 s:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of the process the pane's shell runs (`limiter top`).
    fn child_pid(&self) -> i32 {
        let shell: i32 = self
            .output(&["display-message", "-p", "-t", "top", "#{pane_pid}"])
            .trim()
            .parse()
            .expect("pane pid");
        let children =
            std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        children
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("the pane's shell {shell} runs nothing"))
            .parse()
            .unwrap()
    }

    fn alternate_screen_on(&self) -> bool {
        self.output(&["display-message", "-p", "-t", "top", "#{alternate_on}"])
            .trim()
            == "1"
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
    }
}

/// The shell command for the pane: `program args`, then its exit status and the
/// terminal's settings (`stty -a`) written into `dir`, then a wait so the pane stays.
fn pane_command(program: &Path, args: &str, dir: &Path) -> String {
    format!(
        "{} {args}; echo $? > {}; stty -a > {}; sleep 120",
        program.display(),
        dir.join("status").display(),
        dir.join("stty").display()
    )
}

/// What the pane's command left in `dir` once the program exited: (status, stty -a).
fn exit_and_terminal(dir: &Path) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let (Ok(status), Ok(stty)) = (
            std::fs::read_to_string(dir.join("status")),
            std::fs::read_to_string(dir.join("stty")),
        ) {
            if !stty.is_empty() {
                return (status.trim().to_string(), stty);
            }
        }
        assert!(Instant::now() < deadline, "the program did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The terminal as a shell wants it: line editing and echo on (raw mode off).
fn assert_cooked(stty: &str) {
    let flags: Vec<&str> = stty.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig"] {
        assert!(
            flags.contains(&flag),
            "{flag} is off after exit: raw mode was left on\n{stty}"
        );
    }
}

/// A screen row's cells: the line that starts with `name` and a space, split.
fn row<'a>(screen: &'a str, name: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .map(|l| l.split_whitespace().collect())
}

/// Reads a figure as the screen writes it (exact, or three digits and k/M/G).
fn figure(text: &str) -> Option<f64> {
    let (digits, scale) = match text.chars().last()? {
        'k' => (&text[..text.len() - 1], 1e3),
        'M' => (&text[..text.len() - 1], 1e6),
        'G' => (&text[..text.len() - 1], 1e9),
        _ => (text, 1.0),
    };
    digits.parse::<f64>().ok().map(|d| d * scale)
}

fn web_lab() -> Lab {
    Lab::new(&format!(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = {RATE}\n\
         burst = 200\n"
    ))
}

/// `web`, and `api`: a 50 % canary on another port of the same host.
fn web_and_canary_lab() -> Lab {
    Lab::new(&format!(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = {RATE}\n\
         burst = 200\n\
         [[rules]]\nname = \"api\"\ndst = \"198.18.0.2/32\"\ndst_port = 10\nproto = \"udp\"\n\
         rate = 100\nburst = 10\nenforce_percent = 50\n"
    ))
}

/// 2,000 frames to `api` from 64 sources, 20 times its rate: its refusals drop for the
/// sources in its canary and pass as would-drops for the others (all 64 on one side: a
/// chance of 2^-63).
fn over_the_canary(lab: &Lab) -> SendPlan {
    let template = udp_to_host(&lab.pair, 10, 64);
    let frames = (0..64u8)
        .map(|i| {
            let mut f = template.clone();
            with_ipv4_src(&mut f, Ipv4Addr::new(198, 18, 7, i)).unwrap();
            f
        })
        .collect();
    SendPlan {
        frames,
        rate: Some(2_000),
        count: 2_000,
        duration: Duration::from_secs(3),
        cpu: None,
    }
}

fn over_the_limit(lab: &Lab, duration: Duration) -> SendPlan {
    SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(OFFERED),
        count: OFFERED * duration.as_secs(),
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

/// The rule row's (pass/s, drop/s) once the screen shows rates.
fn rates_of(screen: &str) -> Option<(f64, f64)> {
    // web, enforce, standalone, 2000, pkt/s, PASS/s, DROP/s, ...
    let cells = row(screen, "web")?;
    Some((figure(cells.get(5)?)?, figure(cells.get(6)?)?))
}

#[test]
fn top_shows_the_rates_then_the_totals_and_q_restores_the_terminal() {
    let lab = web_and_canary_lab();
    let _daemon = lab.start();
    join(lab.send_in_background(over_the_canary(&lab)));
    let sender = lab.send_in_background(over_the_limit(&lab, Duration::from_secs(9)));
    std::thread::sleep(Duration::from_millis(1500));

    let dir = tempfile::tempdir().unwrap();
    let pane = Pane::start(&pane_command(
        LIMITER.path(),
        &format!("top --pin-dir {} --interval 1", lab.pins.path.display()),
        dir.path(),
    ));
    // Three successive readings of the rates (each a new second), while traffic runs.
    let mut readings = Vec::new();
    let mut last_title = String::new();
    while readings.len() < 3 {
        let screen = pane.wait_for("a new reading of the web rule's rates", |s| {
            let title = s.lines().next().unwrap_or("");
            title != last_title && title.contains("per second over") && rates_of(s).is_some()
        });
        last_title = screen.lines().next().unwrap().to_string();
        let cells = row(&screen, "web").unwrap();
        assert_eq!(
            cells[..5],
            ["web", "enforce", "standalone", &RATE.to_string(), "pkt/s"],
            "the rule, its mode, share state and rate in force:\n{screen}"
        );
        readings.push(rates_of(&screen).unwrap());
        assert_eq!(
            row(&screen, "api").unwrap()[..3],
            ["api", "canary", "50%"],
            "the canary's mode cell:\n{screen}"
        );
        eprintln!("{screen}");
    }
    let sent = join(sender);
    let offered = sent.frames_per_second();
    readings.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (passed, dropped) = readings[1];
    eprintln!(
        "offered {offered:.0}/s (sent {} in {:.2} s); screen, median of 3: passed {passed}/s \
         dropped {dropped}/s",
        sent.sent,
        sent.span.as_secs_f64()
    );
    let want_dropped = offered - RATE as f64;
    assert!(
        dropped > 0.0 && (dropped - want_dropped).abs() <= 0.1 * want_dropped,
        "dropped {dropped}/s on screen, offered - limit = {want_dropped:.0}/s"
    );
    assert!(
        (passed - RATE as f64).abs() <= 0.1 * RATE as f64,
        "passed {passed}/s on screen, limit {RATE}/s"
    );

    // `t`: the totals, at once (the last reading's), then from each new reading. One
    // taken after the traffic stopped holds what `limiter stats` reads now.
    std::thread::sleep(Duration::from_millis(300));
    let stats = lab.rule_stats("web");
    pane.keys("t");
    let first = pane.wait_for("the totals", |s| {
        s.contains("totals since the maps were created") && row(s, "web").is_some()
    });
    let title = first.lines().next().unwrap().to_string();
    let screen = pane.wait_for("a new reading of the totals", |s| {
        s.lines().next().unwrap_or("") != title && row(s, "web").is_some()
    });
    assert!(
        screen.contains("totals since the maps were created"),
        "{screen}"
    );
    let cells = row(&screen, "web").unwrap();
    for (i, key) in [(5, "passed_packets"), (6, "dropped_packets")] {
        let shown = figure(cells[i]).unwrap();
        let total = stats[key].as_u64().unwrap() as f64;
        assert!(
            (shown - total).abs() <= total * 0.005 + 0.5,
            "{key}: {shown} on screen, {total} in stats --json\n{screen}"
        );
    }
    assert!(screen.contains("global counters, totals"), "{screen}");
    // The canary's totals, split: dropped for its 50 % of sources, would-drop (passed)
    // for the others; both as `limiter stats` counts them.
    let api = lab.rule_stats("api");
    let cells = row(&screen, "api").unwrap();
    for (i, key) in [(7, "dropped_packets"), (8, "would_drop_packets")] {
        let total = api[key].as_u64().unwrap();
        assert!(total > 0, "api {key} is 0: {api}");
        assert_eq!(cells[i], total.to_string(), "api {key}\n{screen}");
    }
    let split = format!(
        "canary api: dropped {} (its 50% of sources), would-drop {} (the other 50%, passed)",
        api["dropped_packets"], api["would_drop_packets"]
    );
    assert!(
        screen.lines().any(|l| l.trim_end() == split),
        "{split} in\n{screen}"
    );
    pane.keys("t");
    pane.wait_for("the rates again", |s| s.contains("per second over"));

    pane.keys("q");
    let (status, stty) = exit_and_terminal(dir.path());
    assert_eq!(status, "0", "limiter top's exit status after q");
    assert_cooked(&stty);
    assert!(
        !pane.alternate_screen_on(),
        "the alternate screen is still on"
    );
}

/// SIGTERM (a service manager, `kill`) ends it as `q` does; pins that vanish under it
/// (`detach`) are said on screen, and it keeps running.
#[test]
fn top_says_when_the_pins_go_and_sigterm_restores_the_terminal() {
    let lab = web_lab();
    let daemon = lab.start();
    let dir = tempfile::tempdir().unwrap();
    let pane = Pane::start(&pane_command(
        LIMITER.path(),
        &format!("top --pin-dir {} --interval 0.5", lab.pins.path.display()),
        dir.path(),
    ));
    pane.wait_for("the web rule", |s| row(s, "web").is_some());
    assert!(
        pane.alternate_screen_on(),
        "top draws on the alternate screen"
    );
    lab.ok(&["detach"]);
    drop(daemon);
    let screen = pane.wait_for("the reading failure", |s| s.contains("reading failed"));
    assert!(
        screen.contains("no pinned limiter maps"),
        "the failure names its cause:\n{screen}"
    );
    assert!(
        row(&screen, "web").is_some(),
        "the last good reading stays:\n{screen}"
    );
    let pid = pane.child_pid();
    // SAFETY: signalling the process this test's pane started, by its id.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (status, stty) = exit_and_terminal(dir.path());
    assert_eq!(status, "0", "limiter top's exit status after SIGTERM");
    assert_cooked(&stty);
    assert!(!pane.alternate_screen_on());
}

/// Whether `pid` is still running (a zombie has ended: its parent reaps it).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // pid (comm) STATE ...: the state follows the last ')'.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

/// A terminal that dies under it (the ssh session drops, the tmux server is killed) ends
/// either view within seconds: crossterm's reader spins forever on a hung-up terminal, and
/// a `top --sources` was once found spinning an hour after its tmux server was killed.
#[test]
fn both_views_exit_when_their_terminal_hangs_up() {
    let lab = web_lab();
    let _daemon = lab.start();
    for (view, ready) in [("top", "web "), ("top --sources", "q quits")] {
        let dir = tempfile::tempdir().unwrap();
        let pane = Pane::start(&pane_command(
            LIMITER.path(),
            &format!(
                "{view} --pin-dir {} --interval 0.5",
                lab.pins.path.display()
            ),
            dir.path(),
        ));
        pane.wait_for(ready, |s| s.contains(ready));
        let pid = pane.child_pid();
        assert!(running(pid), "`limiter {view}` runs in the pane");
        drop(pane); // kill-server: the pane's terminal hangs up
        let deadline = Instant::now() + Duration::from_secs(5);
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let still = running(pid);
        if still {
            // SAFETY: the process this test's pane started, by its id.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(
            !still,
            "`limiter {view}` still runs 5 s after its terminal hung up (killed now)"
        );
    }
}

#[test]
fn top_refuses_a_stdout_that_is_not_a_terminal_and_names_the_alternative() {
    let out = Command::new(LIMITER)
        .args(["top", "--pin-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs a terminal") && err.contains("limiter stats --watch"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing drawn into the pipe");
}

#[test]
fn top_refuses_a_bad_interval_by_name() {
    let out = Command::new(LIMITER)
        .args(["top", "--interval", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--interval") && err.contains("between"),
        "{err}"
    );
}

/// `cargo xtask run` in a terminal: the lab hands the screen to `limiter top`, `q` ends
/// the lab, and it cleans up as without a terminal.
#[test]
fn the_lab_in_a_terminal_runs_top_and_q_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let log: PathBuf = dir.path().join("lab.log");
    // The lab's stdout is the pane's terminal, which it hands to top; its stderr (the
    // daemon's start, errors) goes to a file for the failure message.
    let pane = Pane::start(&format!(
        "{} 2>{}; echo $? > {}; stty -a > {}; sleep 120",
        LIMITER_LAB.path().display(),
        log.display(),
        dir.path().join("status").display(),
        dir.path().join("stty").display()
    ));
    let screen = pane.wait_for("limiter top's screen with the lab's rules", |s| {
        s.contains("limiter top") && row(s, "contoso-web").is_some()
    });
    assert!(
        screen.contains("/sys/fs/bpf/limiter-lab"),
        "top reads the lab's pins:\n{screen}"
    );
    // Let the rates come in, then quit.
    pane.wait_for("the lab's SYN flood being cut", |s| {
        row(s, "contoso-syn")
            .and_then(|c| c.get(6).and_then(|f| figure(f)))
            .is_some_and(|dropped| dropped > 0.0)
    });
    pane.keys("q");
    let (status, stty) = exit_and_terminal(dir.path());
    let screen = pane.screen();
    assert_eq!(
        status,
        "0",
        "the lab's exit status\n{screen}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(screen.contains("cleaned up"), "{screen}");
    assert_cooked(&stty);
    assert!(
        !Path::new("/sys/fs/bpf/limiter-lab").exists(),
        "pins left behind"
    );
}

/// What `top` names for a pipe: `stats --watch` writes one table after another into it,
/// with no screen control.
#[test]
fn stats_watch_into_a_pipe_writes_tables_without_escapes() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 100\n");
    let daemon = lab.start();
    let watch = Command::new(LIMITER)
        .args(["stats", "--watch", "--pin-dir"])
        .arg(&lab.pins.path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: signalling the process this test started, by its id.
    assert_eq!(unsafe { libc::kill(watch.id() as i32, libc::SIGTERM) }, 0);
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.matches("web").count() >= 2,
        "fewer than two tables: {text}"
    );
    assert!(
        !text.contains('\x1b'),
        "terminal escapes written into a pipe: {text:?}"
    );
    daemon.stop();
}
