//! Judging and writing a run: per minute, the legitimate requests' success and latency,
//! each rule's admitted units against its bound outside fail-open windows, what each
//! attack got through; over the run, over-grants and leaks; the goals as PASS/FAIL lines;
//! report.md, CSVs of the samples and SVG plots (limiter-plot) in `--out`.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::{Context as _, Result};
use limiter_plot::{render, Band, Chart, HLine, Series};

use super::{
    attacks::Attack,
    faults::{Fault, FaultRecord},
    measure::{LeakSample, Second},
    percentile, rule_bound, segments,
    traffic::{CurlRecord, WrkSegment},
    RuleSpec, SoakConfig,
};

/// Everything a run recorded; times in s since its epoch.
#[derive(Clone, Debug, Default)]
pub struct RunData {
    pub config: SoakConfig,
    pub rules: Vec<RuleSpec>,
    pub lbs: usize,
    pub baseline: (f64, f64),
    /// Each soak minute's window.
    pub minutes: Vec<(f64, f64)>,
    /// The LB each minute's attacks hit.
    pub targets: Vec<usize>,
    pub seconds: Vec<Second>,
    pub leaks: Vec<LeakSample>,
    pub curl: Vec<CurlRecord>,
    pub wrk: Vec<WrkSegment>,
    /// Each LB's counters at each minute's start, and after the last.
    pub lb_counters: Vec<Vec<BTreeMap<String, u64>>>,
    pub attacks: Vec<(Attack, usize, f64, f64)>,
    pub faults: Vec<FaultRecord>,
    pub describe: Vec<String>,
    pub confinement_frames: usize,
    /// The nftables minutes (the limiter detached, nftables guarding each LB): windows,
    /// targets, and the LBs' counters at each one's start and after the last.
    pub nft_minutes: Vec<(f64, f64)>,
    pub nft_targets: Vec<usize>,
    pub nft_counters: Vec<Vec<BTreeMap<String, u64>>>,
    /// The HAProxy LB's SYN proxy in the nftables minutes: (LB, SYNs it answered).
    pub synproxy: Option<(usize, u64)>,
    /// The machine's CPU (busy %, softirq %) in each limiter minute, then in each
    /// nftables minute.
    pub cpu: Vec<(f64, f64)>,
}

/// A goal's verdict: `PASS name: text` / `FAIL name: text`.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    pub name: &'static str,
    pub pass: bool,
    pub text: String,
}

impl Goal {
    pub fn line(&self) -> String {
        format!(
            "{} {}: {}",
            if self.pass { "PASS" } else { "FAIL" },
            self.name,
            self.text
        )
    }
}

/// Legitimate requests in a window: attempted, succeeded, latencies (s).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Legit {
    pub attempted: u64,
    pub ok: u64,
    /// curl's new-connection latencies.
    pub curl_p50: Option<f64>,
    pub curl_p99: Option<f64>,
    /// The worst LB's wrk p99 (keep-alive) among segments that began in the window.
    pub wrk_p99: Option<f64>,
}

impl Legit {
    pub fn success(&self) -> f64 {
        if self.attempted == 0 {
            return 1.0;
        }
        self.ok as f64 / self.attempted as f64
    }
}

pub fn legit(data: &RunData, from: f64, to: f64) -> Legit {
    let curl: Vec<&CurlRecord> = data
        .curl
        .iter()
        .filter(|r| r.t >= from && r.t < to)
        .collect();
    let wrk: Vec<&WrkSegment> = data
        .wrk
        .iter()
        // Segments are cut at every phase and minute: those that began in the window
        // (give or take the moment wrk takes to start again).
        .filter(|s| s.from >= from - 0.5 && s.from < to - 0.5)
        .collect();
    let latencies: Vec<f64> = curl.iter().filter(|r| r.ok()).map(|r| r.seconds).collect();
    let (wa, wo) = wrk.iter().fold((0, 0), |(a, o), s| {
        let (sa, so) = s.attempted_and_ok();
        (a + sa, o + so)
    });
    Legit {
        attempted: curl.len() as u64 + wa,
        ok: curl.iter().filter(|r| r.ok()).count() as u64 + wo,
        curl_p50: percentile(&latencies, 50.0),
        curl_p99: percentile(&latencies, 99.0),
        wrk_p99: wrk.iter().filter_map(|s| s.p99).reduce(f64::max),
    }
}

/// A rule over one minute: units admitted (all LBs) in the seconds outside fail-open
/// windows, those seconds, the bound, and the seconds declared fail-open.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleMinute {
    pub admitted: u64,
    pub seconds: f64,
    pub bound: f64,
    pub fail_open_seconds: f64,
}

impl RuleMinute {
    pub fn held(&self) -> bool {
        self.admitted as f64 <= self.bound * 1.02
    }
}

pub fn rule_minute(data: &RunData, rule: &RuleSpec, from: f64, to: f64) -> RuleMinute {
    let samples: Vec<&Second> = data
        .seconds
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .collect();
    let mut m = RuleMinute::default();
    let mut included = Vec::new();
    for pair in samples.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let dt = b.t - a.t;
        let complete = (0..data.lbs)
            .all(|lb| a.admitted(lb, rule.name).is_some() && b.admitted(lb, rule.name).is_some());
        let open = a.fail_open(rule.name) || b.fail_open(rule.name);
        if open {
            m.fail_open_seconds += dt;
        }
        let ok = complete && !open;
        included.push(ok);
        if ok {
            m.seconds += dt;
            m.admitted += (0..data.lbs)
                .map(|lb| {
                    b.admitted(lb, rule.name)
                        .unwrap_or(0)
                        .saturating_sub(a.admitted(lb, rule.name).unwrap_or(0))
                })
                .sum::<u64>();
        }
    }
    m.bound = rule_bound(
        rule.rate,
        rule.burst,
        m.seconds,
        segments(&included),
        data.lbs,
    );
    m
}

/// The abuser over one minute: SYNs that reached the LBs' stacks, and its bound: the
/// per-source rate over the time it ran, a burst per LB it hit (doubled while a reload
/// fault had doubled the limits).
pub fn abuser_minute(data: &RunData, minute: usize) -> Option<(u64, f64)> {
    let (from, to) = *data.minutes.get(minute)?;
    let (rate, burst) = data
        .rules
        .iter()
        .find_map(|r| (r.name == Attack::Abuser.rule()).then_some(r.per_source?))?;
    let runs: Vec<&(Attack, usize, f64, f64)> = data
        .attacks
        .iter()
        .filter(|(a, _, f, t)| *a == Attack::Abuser && *f < to && *t > from)
        .collect();
    let secs: f64 = runs
        .iter()
        .map(|(_, _, f, t)| t.min(to) - f.max(from))
        .sum();
    let lbs = runs.len().max(1) as f64;
    let doubled = data
        .faults
        .iter()
        .any(|f| f.fault == Fault::Reload && f.from < to && f.to.unwrap_or(f64::MAX) > from);
    let scale = if doubled { 2.0 } else { 1.0 };
    let got = through(data, minute, Attack::Abuser);
    Some((
        got,
        scale * (rate as f64 * secs.max(0.0) + burst as f64 * lbs),
    ))
}

/// What attack `a` got through to the LBs' stacks in minute `minute` (all LBs).
pub fn through(data: &RunData, minute: usize, a: Attack) -> u64 {
    through_in(&data.lb_counters, minute, a)
}

/// [`through`] from snapshots of the LBs' counters at each minute's start.
pub fn through_in(counters: &[Vec<BTreeMap<String, u64>>], minute: usize, a: Attack) -> u64 {
    let (Some(before), Some(after)) = (counters.get(minute), counters.get(minute + 1)) else {
        return 0;
    };
    before
        .iter()
        .zip(after)
        .map(|(b, a2)| {
            a2.get(a.counter())
                .copied()
                .unwrap_or(0)
                .saturating_sub(b.get(a.counter()).copied().unwrap_or(0))
        })
        .sum()
}

/// Process (name, pid) → its samples (t, RSS KiB, fds).
type Series3 = BTreeMap<(String, u32), Vec<(f64, u64, u64)>>;

fn process_series(leaks: &[LeakSample]) -> Series3 {
    let mut out: Series3 = BTreeMap::new();
    for s in leaks {
        for (name, pid, rss, fds) in &s.processes {
            out.entry((name.clone(), *pid))
                .or_default()
                .push((s.t, *rss, *fds));
        }
    }
    out
}

/// Leaks: each process (same pid) from its first sample 30 s into the soak on: RSS
/// growth within max(16 MiB, 25 %), descriptors within 16; BPF objects held by the
/// daemons and pins no more at the end than at the soak's start; etcd's keys within 3 of
/// the start. Returns the problems found.
pub fn leaks(data: &RunData) -> Vec<String> {
    let warm = data.minutes.first().map_or(0.0, |m| m.0) + 30.0;
    let mut problems = Vec::new();
    for ((name, pid), samples) in process_series(&data.leaks) {
        let warmed: Vec<&(f64, u64, u64)> = samples.iter().filter(|s| s.0 >= warm).collect();
        let (Some(first), Some(last)) = (warmed.first(), warmed.last()) else {
            continue;
        };
        let rss_allowed = (16 * 1024).max(first.1 / 4);
        if last.1 > first.1 + rss_allowed {
            problems.push(format!(
                "{name} (pid {pid}): RSS {} → {} KiB (+{} KiB > {rss_allowed})",
                first.1,
                last.1,
                last.1 - first.1
            ));
        }
        if last.2 > first.2 + 16 {
            problems.push(format!("{name} (pid {pid}): fds {} → {}", first.2, last.2));
        }
    }
    let soak: Vec<&LeakSample> = data.leaks.iter().filter(|s| s.t >= warm).collect();
    if let (Some(first), Some(last)) = (soak.first(), soak.last()) {
        for (what, a, b) in [
            ("BPF programs", first.progs, last.progs),
            ("BPF maps", first.maps, last.maps),
            ("BPF links", first.links, last.links),
            ("pins", first.pins, last.pins),
        ] {
            if b > a {
                problems.push(format!("{what}: {a} → {b}"));
            }
        }
        if let (Some(a), Some(b)) = (first.etcd_keys, last.etcd_keys) {
            if b > a + 3 {
                problems.push(format!("etcd keys: {a} → {b}"));
            }
        }
    }
    problems
}

/// The goals of the issue, judged.
pub fn goals(data: &RunData) -> Vec<Goal> {
    let mut goals = Vec::new();
    let soak = (
        data.minutes.first().map_or(0.0, |m| m.0),
        data.minutes.last().map_or(0.0, |m| m.1),
    );
    let base = legit(data, data.baseline.0, data.baseline.1);
    let run = legit(data, soak.0, soak.1);
    goals.push(Goal {
        name: "legit-success",
        pass: run.attempted > 0 && run.success() >= 0.999,
        text: format!(
            "{:.3} % of {} legitimate requests succeeded (goal ≥ 99.9 %)",
            100.0 * run.success(),
            run.attempted
        ),
    });
    let within = |soak: Option<f64>, base: Option<f64>| match (soak, base) {
        (Some(s), Some(b)) => s <= b * 1.2,
        _ => false,
    };
    let ms = |v: Option<f64>| v.map_or("none".to_string(), |v| format!("{:.2} ms", v * 1e3));
    goals.push(Goal {
        name: "legit-p99",
        pass: within(run.curl_p99, base.curl_p99) && within(run.wrk_p99, base.wrk_p99),
        text: format!(
            "p99 new connections {} vs baseline {}, keep-alive {} vs {} (goal within 20 %)",
            ms(run.curl_p99),
            ms(base.curl_p99),
            ms(run.wrk_p99),
            ms(base.wrk_p99)
        ),
    });
    let mut over = Vec::new();
    let mut checked = 0;
    for (i, (from, to)) in data.minutes.iter().enumerate() {
        for r in &data.rules {
            let m = rule_minute(data, r, *from, *to);
            checked += 1;
            if !m.held() {
                over.push(format!(
                    "minute {} rule {}: {} > {:.0} × 1.02",
                    i + 1,
                    r.name,
                    m.admitted,
                    m.bound
                ));
            }
        }
        if let Some((got, bound)) = abuser_minute(data, i) {
            checked += 1;
            if got as f64 > bound * 1.02 {
                over.push(format!(
                    "minute {} abuser: {got} SYNs > {bound:.0} × 1.02",
                    i + 1
                ));
            }
        }
    }
    goals.push(Goal {
        name: "attacks-held",
        pass: over.is_empty() && checked > 0,
        text: if over.is_empty() {
            format!("{checked} rule-minutes and abuser-minutes within bound × 1.02 outside fail-open windows")
        } else {
            over.join("; ")
        },
    });
    let mut grants = 0;
    let mut over_grants = Vec::new();
    for s in &data.seconds {
        for r in &data.rules {
            if let Some(&g) = s.granted.get(r.name) {
                grants += 1;
                if g > r.rate {
                    over_grants.push(format!("t={:.0} {}: {g} > {}", s.t, r.name, r.rate));
                }
            }
        }
    }
    goals.push(Goal {
        name: "no-over-grant",
        pass: over_grants.is_empty() && grants > 0,
        text: if over_grants.is_empty() {
            format!("Σ shares ≤ quota at all {grants} allocator samples")
        } else {
            over_grants.join("; ")
        },
    });
    let problems = leaks(data);
    goals.push(Goal {
        name: "no-leak",
        pass: problems.is_empty() && data.leaks.len() >= 2,
        text: if problems.is_empty() {
            format!("{} leak samples flat within bounds", data.leaks.len())
        } else {
            problems.join("; ")
        },
    });
    let healed = data.faults.iter().filter(|f| f.to.is_some()).count();
    goals.push(Goal {
        name: "faults",
        pass: healed == data.faults.len() && data.faults.len() >= data.minutes.len().min(2),
        text: format!(
            "{} faults applied, {healed} healed: {}",
            data.faults.len(),
            data.faults
                .iter()
                .map(|f| f.fault.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    goals.push(Goal {
        name: "confinement",
        pass: data.confinement_frames > 0,
        text: format!(
            "{} flood frames captured leaving the attackers, every source in 198.19.128.0/17",
            data.confinement_frames
        ),
    });
    goals
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{:.2}", v * 1e3))
}

/// Writes report.md, the CSVs and the plots into `out`.
pub fn write(data: &RunData, goals: &[Goal], out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut md = String::new();
    let c = &data.config;
    let _ = writeln!(md, "# Soak report\n");
    let _ = writeln!(
        md,
        "`limiter-soak --minutes {} --seed {}`: {} LBs, baseline {} s (no attack, no limiter), \
         then {} minutes with the limiter, attacks and a fault each minute.\n",
        c.minutes,
        c.seed,
        data.lbs,
        c.baseline.as_secs(),
        data.minutes.len()
    );
    let _ = writeln!(md, "## Goals\n\n```");
    for g in goals {
        let _ = writeln!(md, "{}", g.line());
    }
    let _ = writeln!(md, "```\n\n## Load\n");
    let _ = writeln!(
        md,
        "Legitimate: ≈ {:.0} requests/s offered in all (wrk: {} keep-alive connections per LB, \
         a request every {} ms on each; curl: {} new connections/s per LB, each from another \
         source of 198.18.64.0/24). Attacks, each minute against one LB for {} s: SYN flood \
         {} pps (random sources, port 443), UDP flood {} pps, fragment flood {} datagrams/s \
         (7 fragments each), an abuser (wrk, {} connections, a new connection per request).\n",
        c.legit_rate(data.lbs),
        c.wrk_connections,
        c.wrk_delay_ms,
        c.curl_per_s,
        c.attack_length.as_secs(),
        c.syn_flood_pps,
        c.udp_flood_pps,
        c.frag_flood_pps,
        c.abuser_connections
    );
    let _ = writeln!(md, "| rule | port | proto | unit | fleet quota/s | burst | per source |\n|---|---|---|---|---|---|---|");
    for r in &data.rules {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.dst_port.map_or("any".into(), |p| p.to_string()),
            r.proto,
            r.unit,
            r.rate,
            r.burst,
            r.per_source
                .map_or("–".into(), |(a, b)| format!("{a}/s, burst {b}"))
        );
    }
    let base = legit(data, data.baseline.0, data.baseline.1);
    let _ = writeln!(md, "\n## Per minute\n");
    let _ = writeln!(
        md,
        "Baseline: {} requests, {:.3} % ok, new connections p50 {} ms p99 {} ms, keep-alive p99 {} ms.\n",
        base.attempted,
        100.0 * base.success(),
        opt_ms(base.curl_p50),
        opt_ms(base.curl_p99),
        opt_ms(base.wrk_p99)
    );
    let mut header =
        "| minute | target LB | fault | requests | ok % | p50 ms | p99 ms | keep-alive p99 ms |"
            .to_string();
    let mut sep = "|---|---|---|---|---|---|---|---|".to_string();
    for r in &data.rules {
        let _ = write!(header, " {} admitted / bound (fail-open s) |", r.name);
        sep.push_str("---|");
    }
    for a in Attack::ALL {
        let _ = write!(header, " {} through |", a.name());
        sep.push_str("---|");
    }
    let _ = writeln!(md, "{header}\n{sep}");
    for (i, (from, to)) in data.minutes.iter().enumerate() {
        let l = legit(data, *from, *to);
        let fault = data
            .faults
            .iter()
            .filter(|f| f.from >= *from && f.from < *to)
            .map(|f| format!("{} {}", f.fault.name(), f.target))
            .collect::<Vec<_>>()
            .join(", ");
        let mut row = format!(
            "| {} | lb-{} | {} | {} | {:.3} | {} | {} | {} |",
            i + 1,
            data.targets.get(i).copied().unwrap_or(0),
            fault,
            l.attempted,
            100.0 * l.success(),
            opt_ms(l.curl_p50),
            opt_ms(l.curl_p99),
            opt_ms(l.wrk_p99)
        );
        for r in &data.rules {
            let m = rule_minute(data, r, *from, *to);
            let _ = write!(
                row,
                " {} / {:.0} ({:.0}) |",
                m.admitted, m.bound, m.fail_open_seconds
            );
        }
        for a in Attack::ALL {
            let got = through(data, i, a);
            if a == Attack::Abuser {
                let bound = abuser_minute(data, i).map_or(0.0, |b| b.1);
                let _ = write!(row, " {got} / {bound:.0} |");
            } else {
                let _ = write!(row, " {got} |");
            }
        }
        let _ = writeln!(md, "{row}");
    }
    let _ = writeln!(
        md,
        "\n*admitted*: units the rule admitted on all LBs (SYNs for a syn rule), from the pinned \
         counters each second, in the seconds no LB's share of it was failing open; *bound*: \
         quota × those seconds + a burst per LB for each unbroken stretch. *through*: what \
         reached the LBs' stacks from the attack (nftables counters on each LB's ingress, after \
         the limiter); the abuser's bound is its per-source limit over the time it ran.\n"
    );
    side_by_side(data, &mut md);
    let _ = writeln!(
        md,
        "## Faults\n\n| fault | target | from s | to s | what |\n|---|---|---|---|---|"
    );
    for f in &data.faults {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {} | {} |",
            f.fault.name(),
            f.target,
            f.from,
            f.to.map_or("–".into(), |t| format!("{t:.1}")),
            f.note
        );
    }
    let _ = writeln!(md, "\n## Leaks\n\n| t s | processes (RSS MiB / fds) | BPF progs / maps / links | pins | etcd keys |\n|---|---|---|---|---|");
    for s in &data.leaks {
        let procs = s
            .processes
            .iter()
            .map(|(n, _, rss, fds)| format!("{n} {:.1}/{fds}", *rss as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            md,
            "| {:.0} | {procs} | {} / {} / {} | {} | {} |",
            s.t,
            s.progs,
            s.maps,
            s.links,
            s.pins,
            s.etcd_keys.map_or("–".into(), |k| k.to_string())
        );
    }
    let _ = writeln!(md, "\n## Plots\n");
    for (file, chart) in plots(data) {
        std::fs::write(out.join(&file), render(&chart))
            .with_context(|| format!("writing {file}"))?;
        let _ = writeln!(md, "![{}]({file})\n", chart.title);
    }
    let _ = writeln!(md, "## The rig\n");
    for line in &data.describe {
        let _ = writeln!(md, "- {line}");
    }
    std::fs::write(out.join("report.md"), md).context("writing report.md")?;
    write_csvs(data, out)
}

/// The same attacks held by the limiter and by nftables (the last minutes, the limiter
/// detached): per minute, what the clients saw, what each attack got through and the
/// machine's CPU.
fn side_by_side(data: &RunData, md: &mut String) {
    if data.nft_minutes.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Side by side: nftables\n\nThe last {} minute(s): every limiter detached, each LB guarded \
         by nftables instead (a netdev ingress chain on `ingress`: a meter per source for port 80's \
         SYNs, `limit` statements for the rest, each fleet quota split evenly over the LBs: \
         nftables has no allocator) and, on the HAProxy LB, a SYN proxy for its VIP (`synproxy`: \
         the NAT LBs' DNAT needs conntrack on the SYN, which the proxy takes away), the same \
         attacks, no fault. CPU is the whole machine's \
         (everything runs on its two cores, with whatever else runs on the machine then); \
         softirq is where XDP and nftables' ingress hook run. The limiter's bound is the fleet's \
         quota, which the allocator gives to the LB under attack; nftables holds each LB to its \
         static part, so it lets less of a flood on one LB through.\n",
        data.nft_minutes.len()
    );
    let mut header =
        "| guard | minute | target LB | requests | ok % | p50 ms | p99 ms | keep-alive p99 ms |"
            .to_string();
    let mut sep = "|---|---|---|---|---|---|---|---|".to_string();
    for a in Attack::ALL {
        let _ = write!(header, " {} through |", a.name());
        sep.push_str("---|");
    }
    header.push_str(" CPU busy % | softirq % |");
    sep.push_str("---|---|");
    let _ = writeln!(md, "{header}\n{sep}");
    let phases = [
        (
            "limiter",
            &data.minutes,
            &data.targets,
            &data.lb_counters,
            0,
        ),
        (
            "nftables",
            &data.nft_minutes,
            &data.nft_targets,
            &data.nft_counters,
            data.minutes.len(),
        ),
    ];
    for (guard, minutes, targets, counters, cpu_offset) in phases {
        for (i, (from, to)) in minutes.iter().enumerate() {
            let l = legit(data, *from, *to);
            let mut row = format!(
                "| {guard} | {} | lb-{} | {} | {:.3} | {} | {} | {} |",
                i + 1,
                targets.get(i).copied().unwrap_or(0),
                l.attempted,
                100.0 * l.success(),
                opt_ms(l.curl_p50),
                opt_ms(l.curl_p99),
                opt_ms(l.wrk_p99)
            );
            for a in Attack::ALL {
                let _ = write!(row, " {} |", through_in(counters, i, a));
            }
            match data.cpu.get(cpu_offset + i) {
                Some((busy, soft)) => {
                    let _ = write!(row, " {busy:.0} | {soft:.0} |");
                }
                None => row.push_str(" – | – |"),
            }
            let _ = writeln!(md, "{row}");
        }
    }
    let _ = writeln!(md);
    if let Some((lb, answered)) = data.synproxy {
        let _ = writeln!(
            md,
            "The SYN proxy on lb-{lb} answered {answered} SYNs with a syncookie in the nftables \
             minutes (legitimate clients' and, in a minute that attacked lb-{lb}, what the guard \
             let through of the floods).\n"
        );
    }
}

fn write_csvs(data: &RunData, out: &Path) -> Result<()> {
    let mut s = String::from("t,lb,rule,state,share,admitted,dropped,granted\n");
    for sec in &data.seconds {
        for (i, h) in sec.hosts.iter().enumerate() {
            for (rule, r) in h {
                let _ = writeln!(
                    s,
                    "{:.2},lb-{},{rule},{},{},{},{},{}",
                    sec.t,
                    i + 1,
                    r.state,
                    r.share,
                    r.admitted,
                    r.dropped,
                    sec.granted
                        .get(rule)
                        .map_or(String::new(), |g| g.to_string())
                );
            }
        }
    }
    std::fs::write(out.join("seconds.csv"), s)?;
    let mut l = String::from("t,process,pid,rss_kib,fds,progs,maps,links,pins,etcd_keys\n");
    for x in &data.leaks {
        for (n, pid, rss, fds) in &x.processes {
            let _ = writeln!(
                l,
                "{:.1},{n},{pid},{rss},{fds},{},{},{},{},{}",
                x.t,
                x.progs,
                x.maps,
                x.links,
                x.pins,
                x.etcd_keys.map_or(String::new(), |k| k.to_string())
            );
        }
    }
    std::fs::write(out.join("leaks.csv"), l)?;
    let mut c = String::from("t,lb,code,seconds\n");
    for r in &data.curl {
        let _ = writeln!(c, "{:.3},lb-{},{},{:.6}", r.t, r.lb, r.code, r.seconds);
    }
    std::fs::write(out.join("curl.csv"), c)?;
    let mut w = String::from("from,to,lb,requests,socket_errors,timeouts,non_2xx,p50_s,p99_s\n");
    for x in &data.wrk {
        let _ = writeln!(
            w,
            "{:.1},{:.1},lb-{},{},{},{},{},{},{}",
            x.from,
            x.to,
            x.lb,
            x.requests,
            x.socket_errors,
            x.timeouts,
            x.non_2xx,
            x.p50.map_or(String::new(), |v| v.to_string()),
            x.p99.map_or(String::new(), |v| v.to_string())
        );
    }
    std::fs::write(out.join("wrk.csv"), w)?;
    let mut f = String::from("fault,target,from,to,note\n");
    for x in &data.faults {
        let _ = writeln!(
            f,
            "{},{},{:.1},{},\"{}\"",
            x.fault.name(),
            x.target,
            x.from,
            x.to.map_or(String::new(), |t| format!("{t:.1}")),
            x.note.replace('"', "'")
        );
    }
    std::fs::write(out.join("faults.csv"), f)?;
    Ok(())
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

fn plots(data: &RunData) -> Vec<(String, Chart)> {
    let marks: Vec<(f64, String)> = data
        .faults
        .iter()
        .map(|f| (f.from, f.fault.name().to_string()))
        .collect();
    let mut out = Vec::new();
    for r in &data.rules {
        let mut points = Vec::new();
        let mut bands = Vec::new();
        let mut open_from: Option<f64> = None;
        for pair in data.seconds.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let dt = (b.t - a.t).max(1e-3);
            let sum: u64 = (0..data.lbs)
                .map(|lb| {
                    b.admitted(lb, r.name)
                        .unwrap_or(0)
                        .saturating_sub(a.admitted(lb, r.name).unwrap_or(0))
                })
                .sum();
            points.push((b.t, sum as f64 / dt));
            match (b.fail_open(r.name), open_from) {
                (true, None) => open_from = Some(a.t),
                (false, Some(f)) => {
                    bands.push(Band {
                        from: f,
                        to: b.t,
                        color: "#ffdddd",
                        label: "fail-open".into(),
                        strip: false,
                    });
                    open_from = None;
                }
                _ => {}
            }
        }
        if let (Some(f), Some(last)) = (open_from, data.seconds.last()) {
            bands.push(Band {
                from: f,
                to: last.t,
                color: "#ffdddd",
                label: "fail-open".into(),
                strip: false,
            });
        }
        out.push((
            format!("rule-{}.svg", r.name),
            Chart {
                title: format!("rule {}: admitted on all LBs ({}/s)", r.name, r.unit),
                x_label: "s since start".into(),
                y_label: format!("{}/s", r.unit),
                series: vec![Series::new("admitted", COLORS[0], points)],
                bands,
                hlines: vec![HLine {
                    y: r.rate as f64,
                    label: format!("quota {}", r.rate),
                    color: "#d62728",
                }],
                marks: marks.clone(),
                ..Chart::default()
            },
        ));
    }
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    let mut wrk = Vec::new();
    let windows: Vec<(f64, f64)> = std::iter::once(data.baseline)
        .chain(data.minutes.iter().copied())
        .collect();
    for (from, to) in windows {
        let l = legit(data, from, to);
        let x = (from + to) / 2.0;
        if let Some(v) = l.curl_p50 {
            p50.push((x, v * 1e3));
        }
        if let Some(v) = l.curl_p99 {
            p99.push((x, v * 1e3));
        }
        if let Some(v) = l.wrk_p99 {
            wrk.push((x, v * 1e3));
        }
    }
    out.push((
        "latency.svg".into(),
        Chart {
            title: "legitimate latency per minute (first point: baseline)".into(),
            x_label: "s since start".into(),
            y_label: "ms".into(),
            series: vec![
                Series::new("new connection p50", COLORS[0], p50),
                Series::new("new connection p99", COLORS[1], p99),
                Series::new("keep-alive p99 (worst LB)", COLORS[2], wrk),
            ],
            marks: marks.clone(),
            ..Chart::default()
        },
    ));
    let series = process_series(&data.leaks);
    let mut by_name: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for ((name, _), samples) in series {
        by_name
            .entry(name)
            .or_default()
            .extend(samples.iter().map(|(t, rss, _)| (*t, *rss as f64 / 1024.0)));
    }
    out.push((
        "rss.svg".into(),
        Chart {
            title: "resident memory of the daemons, replicas and etcd".into(),
            x_label: "s since start".into(),
            y_label: "MiB".into(),
            series: by_name
                .into_iter()
                .enumerate()
                .map(|(i, (name, pts))| Series::new(&name, COLORS[i % COLORS.len()], pts))
                .collect(),
            marks,
            ..Chart::default()
        },
    ));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;
    use crate::soak::{daemons::RuleReading, rules};

    fn second(t: f64, admitted: u64, state: &'static str, granted: u64) -> Second {
        let reading = RuleReading {
            state,
            share: 100,
            admitted,
            dropped: 0,
        };
        let host: BTreeMap<String, RuleReading> = rules()
            .iter()
            .map(|r| (r.name.to_string(), reading.clone()))
            .collect();
        Second {
            t,
            hosts: vec![host.clone(), host.clone(), host],
            granted: rules()
                .iter()
                .map(|r| (r.name.to_string(), granted))
                .collect(),
            leader: Some("alloc-1".into()),
        }
    }

    fn data(seconds: Vec<Second>) -> RunData {
        RunData {
            rules: rules(),
            lbs: 3,
            minutes: vec![(0.0, 60.0)],
            seconds,
            ..RunData::default()
        }
    }

    #[test]
    fn a_rule_within_its_bound_is_held_and_one_over_it_is_not() {
        let rule = &rules()[2];
        // Each LB admits rate/3 per second: the fleet exactly at its quota.
        let per = rule.rate / 3;
        let d = data(
            (0..=60)
                .map(|t| second(t as f64, t * per, "leased", 300))
                .collect(),
        );
        let m = rule_minute(&d, rule, 0.0, 60.0);
        assert_eq!(m.admitted, 60 * 3 * per);
        assert!(m.held(), "{m:?}");
        // Twice the quota for a minute is far over any burst.
        let d = data(
            (0..=60)
                .map(|t| second(t as f64, t * 2 * per, "leased", 300))
                .collect(),
        );
        assert!(!rule_minute(&d, rule, 0.0, 60.0).held());
    }

    #[test]
    fn fail_open_seconds_are_left_out_of_the_bound() {
        let rule = &rules()[2];
        let d = data(
            (0..=60)
                .map(|t| {
                    let open = (20..40).contains(&t);
                    // Ten times the quota while failing open, the quota otherwise.
                    let admitted = if t < 20 {
                        t * 100
                    } else if t < 40 {
                        2000 + (t - 20) * 1000
                    } else {
                        22_000 + (t - 40) * 100
                    };
                    second(
                        t as f64,
                        admitted,
                        if open { "fail_open" } else { "leased" },
                        300,
                    )
                })
                .collect(),
        );
        let m = rule_minute(&d, rule, 0.0, 60.0);
        assert!(m.fail_open_seconds >= 20.0);
        assert!(m.held(), "{m:?}");
        assert_eq!(m.seconds, 39.0);
    }

    #[test]
    fn over_grants_and_legit_failures_fail_their_goals() {
        let mut d = data(
            (0..=60)
                .map(|t| second(t as f64, t * 10, "leased", 300))
                .collect(),
        );
        d.seconds[5].granted.insert("web".into(), 601);
        d.curl = (0..1000)
            .map(|i| CurlRecord {
                t: 1.0 + i as f64 * 0.05,
                lb: 1,
                code: if i < 5 { 0 } else { 200 },
                seconds: 0.001,
            })
            .collect();
        let g = goals(&d);
        let get = |n: &str| g.iter().find(|g| g.name == n).unwrap().clone();
        assert!(!get("no-over-grant").pass, "{:?}", get("no-over-grant"));
        assert!(!get("legit-success").pass, "{:?}", get("legit-success"));
        d.seconds[5].granted.insert("web".into(), 600);
        d.curl[0].code = 200;
        d.curl[1].code = 200;
        d.curl[2].code = 200;
        d.curl[3].code = 200;
        let g = goals(&d);
        let get = |n: &str| g.iter().find(|g| g.name == n).unwrap().clone();
        assert!(get("no-over-grant").pass);
        assert!(get("legit-success").pass, "{:?}", get("legit-success"));
    }

    #[test]
    fn a_growing_process_is_a_leak() {
        let sample = |t: f64, rss: u64| LeakSample {
            t,
            processes: vec![("lb-1".into(), 42, rss, 20)],
            progs: 2,
            maps: 30,
            links: 1,
            pins: 30,
            etcd_keys: Some(10),
        };
        let mut d = data(Vec::new());
        d.leaks = vec![
            sample(40.0, 50_000),
            sample(50.0, 51_000),
            sample(60.0, 52_000),
        ];
        assert!(leaks(&d).is_empty());
        d.leaks.push(sample(70.0, 120_000));
        assert_eq!(leaks(&d).len(), 1, "{:?}", leaks(&d));
        d.leaks.pop();
        d.leaks.push(LeakSample {
            maps: 31,
            ..sample(70.0, 52_000)
        });
        assert_eq!(leaks(&d), vec!["BPF maps: 30 → 31".to_string()]);
    }
}
