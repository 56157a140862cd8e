//! `cargo xtask soak [--minutes N] [--seed S] [--out DIR]`: the dress rehearsal (see
//! `limiter_bench::soak` and docs/soak.md). Three LBs (nftables NAT, nftables NAT,
//! HAProxy) in front of nginx, the limiter on each in fleet mode with three allocator
//! replicas on etcd, wrk and curl clients, hping3 and wrk attackers, a fault a minute.
//! A baseline with no attack and no limiter first; then the minutes. Writes report.md,
//! CSVs and plots into `--out`, prints the goals as PASS/FAIL lines and exits non-zero
//! on any FAIL. Everything it creates is removed on the way out, also on SIGINT/SIGTERM,
//! errors and panics.

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_bench::{
    fleet_lab::fleet::sibling,
    soak::{faults, measure, report, rig::Rig, rules, services, topology, Rng, SoakConfig},
};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

const USAGE: &str =
    "usage: limiter-soak [--minutes N] [--nft-minutes N] [--seed S] [--out DIR] [--baseline-s N]";

struct Options {
    config: SoakConfig,
    out: PathBuf,
}

fn options() -> Result<Options> {
    let mut o = Options {
        config: SoakConfig::default(),
        out: PathBuf::from("soak-report"),
    };
    let mut baseline_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{arg} needs a value; {USAGE}"))
        };
        let number = |text: String| -> Result<u64> {
            text.parse()
                .with_context(|| format!("{arg} {text:?}: not a whole number; {USAGE}"))
        };
        match arg.as_str() {
            "--minutes" => {
                o.config.minutes = number(value()?)?;
                if o.config.minutes == 0 {
                    bail!("--minutes 0: the soak needs at least one minute");
                }
                if !baseline_given {
                    o.config.baseline = SoakConfig::baseline_for(o.config.minutes);
                }
            }
            "--nft-minutes" => o.config.nft_minutes = number(value()?)?,
            "--seed" => o.config.seed = number(value()?)?,
            "--baseline-s" => {
                o.config.baseline = Duration::from_secs(number(value()?)?.max(10));
                baseline_given = true;
            }
            "--out" => o.out = PathBuf::from(value()?),
            _ => bail!("unknown argument {arg:?}; {USAGE}"),
        }
    }
    Ok(o)
}

/// The run's working directory (configs, sockets, certificates, logs); its logs are
/// copied into `--out` and it is removed on drop.
struct RunDir {
    path: PathBuf,
    keep_logs_in: PathBuf,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let logs = self.keep_logs_in.join("logs");
        if std::fs::create_dir_all(&logs).is_ok() {
            for entry in std::fs::read_dir(&self.path)
                .into_iter()
                .flatten()
                .flatten()
            {
                let p = entry.path();
                if p.extension()
                    .is_some_and(|e| e == "log" || e == "toml" || e == "cfg")
                {
                    let _ = std::fs::copy(&p, logs.join(entry.file_name()));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Sleeps until `until`, or until SIGINT/SIGTERM; false if stopped.
fn wait_until(until: Instant) -> bool {
    while Instant::now() < until {
        if STOP.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
    !STOP.load(Ordering::Relaxed)
}

fn run(o: Options) -> Result<bool> {
    let c = o.config.clone();
    let limiter = sibling("limiter", "limiter-user")?;
    let allocator = sibling("limiter-allocator", "limiter-allocator")?;
    limiter_tests::netns::require_root()?;
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let out = o.out.canonicalize()?;
    let dir = RunDir {
        path: std::env::temp_dir().join(format!("limiter-soak-{}", std::process::id())),
        keep_logs_in: out.clone(),
    };
    std::fs::create_dir_all(&dir.path)?;
    println!(
        "soak: minutes={} seed={} baseline_s={} legit_rps={:.0} syn_flood_pps={} \
         udp_flood_pps={} frag_flood_pps={} out={}",
        c.minutes,
        c.seed,
        c.baseline.as_secs(),
        c.legit_rate(3),
        c.syn_flood_pps,
        c.udp_flood_pps,
        c.frag_flood_pps,
        out.display()
    );
    let mut rig = Rig::new(c.clone(), &limiter, &allocator, &dir.path)?;
    println!(
        "soak: rig up in {:.1} s; the floods' sources confined ({} frames checked)",
        rig.t(),
        rig.confinement_frames
    );
    let mut data = report::RunData {
        config: c.clone(),
        rules: rules(),
        lbs: rig.topo.lbs,
        ..report::RunData::default()
    };
    rig.start_clients()?;
    let from = rig.t();
    if !wait_until(Instant::now() + c.baseline) {
        bail!("stopped (SIGINT/SIGTERM) during the baseline");
    }
    data.baseline = (from, rig.t());
    rig.cut();
    println!("soak: baseline done at t={:.0}", rig.t());
    rig.start_limiters()?;
    println!("soak: limiters attached at t={:.0}", rig.t());
    let settle_end = Instant::now() + c.settle;
    while Instant::now() < settle_end && !STOP.load(Ordering::Relaxed) {
        data.seconds.push(rig.second());
        wait_until(Instant::now() + Duration::from_secs(1));
    }
    data.leaks.push(rig.leak_sample());
    let schedule = faults::schedule(c.seed, c.minutes, rig.topo.lbs);
    let mut rng = Rng::new(c.seed.wrapping_add(1));
    data.lb_counters.push(rig.lb_counters());
    'minutes: for (m, (fault, fault_lb)) in schedule.iter().enumerate() {
        let start = Instant::now();
        let from = rig.t();
        rig.cut();
        let cpu = measure::cpu_times();
        let target = 1 + rng.below(rig.topo.lbs);
        data.targets.push(target);
        let (mut launched, mut faulted) = (false, false);
        let mut next_second = start;
        let mut next_leak = start + Duration::from_secs(10);
        while start.elapsed() < Duration::from_secs(60) {
            if STOP.load(Ordering::Relaxed) {
                break 'minutes;
            }
            if !launched && start.elapsed() >= c.attack_start {
                rig.attacks
                    .launch(&rig.topo.ns("at"), target, &c, c.attack_length, rig.epoch)?;
                launched = true;
            }
            if !faulted && start.elapsed() >= c.fault_at {
                rig.begin(*fault, *fault_lb)
                    .with_context(|| format!("minute {}: fault {}", m + 1, fault.name()))?;
                if let Some(f) = rig.faults.last() {
                    println!(
                        "soak: t={:.1} fault {} on {}: {}",
                        f.from,
                        f.fault.name(),
                        f.target,
                        f.note
                    );
                }
                faulted = true;
            }
            rig.heal(false)?;
            rig.attacks.reap(rig.epoch, false);
            if Instant::now() >= next_second {
                data.seconds.push(rig.second());
                next_second += Duration::from_secs(1);
            }
            if Instant::now() >= next_leak {
                data.leaks.push(rig.leak_sample());
                next_leak += Duration::from_secs(10);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        data.minutes.push((from, rig.t()));
        data.lb_counters.push(rig.lb_counters());
        if let (Some(a), Some(b)) = (cpu, measure::cpu_times()) {
            data.cpu.push(measure::cpu_share(a, b));
        }
        println!(
            "soak: minute {} done at t={:.0} (attacks on lb-{target})",
            m + 1,
            rig.t()
        );
    }
    rig.cut();
    rig.attacks.reap(rig.epoch, true);
    rig.heal(true)?;
    data.leaks.push(rig.leak_sample());
    if c.nft_minutes > 0 && !STOP.load(Ordering::Relaxed) {
        nftables_minutes(&mut rig, &mut data, &mut rng)?;
    }
    if let Some(mut clients) = rig.clients.take() {
        clients.stop();
        data.curl = clients.curl.lock().map(|c| c.clone()).unwrap_or_default();
        data.wrk = clients.wrk.lock().map(|w| w.clone()).unwrap_or_default();
    }
    data.attacks = rig.attacks.log.clone();
    data.faults = rig.faults.clone();
    data.describe = rig.describe();
    data.confinement_frames = rig.confinement_frames;
    let (namespaces, pins): (Vec<String>, Vec<PathBuf>) = (
        rig.topo.namespaces().to_vec(),
        rig.daemons.iter().map(|d| d.pins.clone()).collect(),
    );
    drop(rig);
    let left: Vec<String> = namespaces
        .iter()
        .filter(|ns| std::path::Path::new(&format!("/run/netns/{ns}")).exists())
        .cloned()
        .chain(
            pins.iter()
                .filter(|p| p.exists())
                .map(|p| p.display().to_string()),
        )
        .collect();
    if left.is_empty() {
        println!("soak: cleaned up (processes ended, namespaces, links and pins removed)");
    } else {
        println!("soak: left behind: {}", left.join(" "));
    }
    if STOP.load(Ordering::Relaxed) {
        bail!(
            "stopped (SIGINT/SIGTERM) after {} minutes",
            data.minutes.len()
        );
    }
    let goals = report::goals(&data);
    report::write(&data, &goals, &out)?;
    for g in &goals {
        println!("{}", g.line());
    }
    println!("soak: report {}", out.join("report.md").display());
    Ok(goals.iter().all(|g| g.pass) && left.is_empty())
}

/// The side by side: every limiter detached, nftables guarding each LB, the same attacks
/// for `nft_minutes` minutes, no fault.
fn nftables_minutes(rig: &mut Rig, data: &mut report::RunData, rng: &mut Rng) -> Result<()> {
    let c = rig.c.clone();
    for d in &mut rig.daemons {
        d.detach();
    }
    for n in 1..=rig.topo.lbs {
        services::nft_guard(&rig.topo.lb(n), rig.topo.lbs, &rig.rules)
            .with_context(|| format!("guarding lb-{n} with nftables"))?;
    }
    // The last LB runs HAProxy, which terminates the clients' connections itself.
    let haproxy_lb = rig.topo.lbs;
    services::nft_synproxy(&rig.topo.lb(haproxy_lb), topology::vip(haproxy_lb))
        .with_context(|| format!("a SYN proxy on lb-{haproxy_lb}"))?;
    println!(
        "soak: limiters detached, nftables guards each LB at t={:.0}",
        rig.t()
    );
    data.nft_counters.push(rig.lb_counters());
    for m in 0..c.nft_minutes {
        let start = Instant::now();
        let from = rig.t();
        rig.cut();
        let cpu = measure::cpu_times();
        let target = 1 + rng.below(rig.topo.lbs);
        data.nft_targets.push(target);
        let mut launched = false;
        while start.elapsed() < Duration::from_secs(60) {
            if STOP.load(Ordering::Relaxed) {
                return Ok(());
            }
            if !launched && start.elapsed() >= c.attack_start {
                rig.attacks
                    .launch(&rig.topo.ns("at"), target, &c, c.attack_length, rig.epoch)?;
                launched = true;
            }
            rig.attacks.reap(rig.epoch, false);
            std::thread::sleep(Duration::from_millis(100));
        }
        data.nft_minutes.push((from, rig.t()));
        data.nft_counters.push(rig.lb_counters());
        if let (Some(a), Some(b)) = (cpu, measure::cpu_times()) {
            data.cpu.push(measure::cpu_share(a, b));
        }
        println!(
            "soak: nftables minute {} done at t={:.0} (attacks on lb-{target})",
            m + 1,
            rig.t()
        );
    }
    rig.cut();
    rig.attacks.reap(rig.epoch, true);
    let answered = services::synproxy_answered(&rig.topo.lb(haproxy_lb))
        .with_context(|| format!("reading lb-{haproxy_lb}'s SYN proxy counter"))?;
    println!("soak: the SYN proxy on lb-{haproxy_lb} answered {answered} SYNs");
    data.synproxy = Some((haproxy_lb, answered));
    Ok(())
}

fn main() -> ExitCode {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    match options().and_then(run) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("limiter-soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}
