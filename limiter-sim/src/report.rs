//! The summary table (stdout), `report.md` and its SVG plots.

use std::{fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use limiter_fleet::share::ShareState;
use limiter_plot::{self as svg, Band, Chart, HLine, Series};

use crate::{
    bootstrap::{self, BOOTSTRAP_CLAIM_PCT},
    claims::{self, rule_figures, Claim, Verdict},
    metrics::{state_index, Drops, RuleSeries, Run},
    time::{MS, NS_PER_S},
};

const BLUE: &str = "#1f77b4";
const GREY: &str = "#7f7f7f";
const RED: &str = "#d62728";
const GREEN: &str = "#2ca02c";
const ORANGE: &str = "#ff7f0e";
const PURPLE: &str = "#9467bd";

fn fmt_pct(p: f64) -> String {
    if p.is_finite() {
        format!("{p:+.1} %")
    } else {
        "–".into()
    }
}

/// One row of the summary table.
pub struct Row {
    pub scenario: String,
    pub simulated: String,
    pub wall: Duration,
    pub frames: u64,
    pub contoso_up: String,
    pub contoso_outage: String,
    pub contoso_false: String,
    /// Mean admitted ÷ quota over the seconds offered ≥ 105 % of it (allocator up).
    pub contoso_admitted: String,
    pub converge: String,
    pub directory: String,
    pub background_false: String,
    pub reports_per_s: String,
}

pub fn rows(runs: &[Run]) -> Vec<Row> {
    runs.iter()
        .map(|run| {
            let contoso = run.rule("contoso").map(|r| (r, rule_figures(run, r)));
            let directory = run
                .rule("directory")
                .filter(|r| r.seconds.iter().any(|c| c.offered > 0))
                .map(|r| rule_figures(run, r));
            let mut bg = Drops::default();
            for r in run.rules.iter().filter(|r| !r.tracked) {
                bg.add(rule_figures(run, r).drops_up);
            }
            let converge = contoso
                .as_ref()
                .map(|(r, _)| {
                    claims::convergence_intervals(run, r)
                        .iter()
                        .map(|(_, c, _)| c.map_or("never".into(), |c| format!("{c:.0}")))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let secs = (run.scenario.duration / NS_PER_S).max(1);
            Row {
                scenario: run.scenario.name.clone(),
                simulated: format!("{} s", run.scenario.duration / NS_PER_S),
                wall: run.wall,
                frames: run.frames,
                contoso_up: contoso.as_ref().map_or("–".into(), |(_, f)| {
                    format!(
                        "{} / {} s",
                        fmt_pct(f.overshoot_up.max_pct),
                        f.overshoot_up.secs_over
                    )
                }),
                contoso_outage: contoso
                    .as_ref()
                    .and_then(|(_, f)| f.overshoot_outage)
                    .map_or("–".into(), |o| {
                        format!("{} / {} s", fmt_pct(o.max_pct), o.secs_over)
                    }),
                contoso_false: contoso.as_ref().map_or("–".into(), |(_, f)| {
                    format!("{:.1} %", f.drops_up.false_pct_of_offered())
                }),
                contoso_admitted: contoso
                    .as_ref()
                    .and_then(|(_, f)| f.saturated_admitted_pct)
                    .map_or("–".into(), |p| format!("{p:.1} %")),
                converge: if converge.is_empty() {
                    "–".into()
                } else {
                    converge
                },
                directory: directory.map_or("–".into(), |f| {
                    let o = f.overshoot_outage.unwrap_or(f.overshoot_up);
                    format!("{} / {} s", fmt_pct(o.max_pct), o.secs_over)
                }),
                background_false: if bg.offered == 0 {
                    "–".into()
                } else {
                    format!("{:.1} %", bg.false_pct_of_offered())
                },
                reports_per_s: format!(
                    "{:.0}",
                    run.allocator.reports.iter().sum::<u64>() as f64 / secs as f64
                ),
            }
        })
        .collect()
}

const HEADER: [&str; 12] = [
    "scenario",
    "simulated",
    "wall",
    "frames",
    "Contoso max 1 s overshoot / s > 2 % (allocator up)",
    "(outage)",
    "Contoso false drops",
    "Contoso admitted ÷ quota when offered > 105 %",
    "shares settle (intervals)",
    "Directory max overshoot / s > 2 %",
    "background false drops",
    "reports/s",
];

fn cells(r: &Row) -> [String; 12] {
    [
        r.scenario.clone(),
        r.simulated.clone(),
        format!("{:.2} s", r.wall.as_secs_f64()),
        format!("{:.1} M", r.frames as f64 / 1e6),
        r.contoso_up.clone(),
        r.contoso_outage.clone(),
        r.contoso_false.clone(),
        r.contoso_admitted.clone(),
        r.converge.clone(),
        r.directory.clone(),
        r.background_false.clone(),
        r.reports_per_s.clone(),
    ]
}

/// The summary as a plain-text table for the terminal.
pub fn text_table(rows: &[Row]) -> String {
    let short = [
        "scenario",
        "sim",
        "wall",
        "frames",
        "contoso up",
        "outage",
        "false",
        "admitted",
        "converge",
        "directory",
        "bg false",
        "rep/s",
    ];
    let all: Vec<[String; 12]> = rows.iter().map(cells).collect();
    let mut w = short.map(|h| h.chars().count());
    for c in &all {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.chars().count());
        }
    }
    let mut o = String::new();
    let line = |o: &mut String, c: &[String]| {
        for (i, s) in c.iter().enumerate() {
            let _ = write!(o, "{s:<width$}  ", width = w[i]);
        }
        o.push('\n');
    };
    line(&mut o, &short.map(String::from));
    for c in &all {
        line(&mut o, c);
    }
    o
}

fn md_table(o: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(o, "| {} |", header.join(" | "));
    let _ = writeln!(o, "|{}", "---|".repeat(header.len()));
    for r in rows {
        let _ = writeln!(o, "| {} |", r.join(" | "));
    }
    o.push('\n');
}

pub fn claims_text(claims: &[Claim]) -> String {
    let mut o = String::new();
    for c in claims {
        let _ = writeln!(
            o,
            "[{}] {} ({}): expected {}; simulated {}",
            match c.verdict {
                Verdict::Holds => "holds",
                Verdict::Fails => "FAILS",
            },
            c.claim,
            c.scenario,
            c.expected,
            c.simulated
        );
    }
    o
}

/// Contiguous tick runs with at least one host in `state`, merged across gaps < 1 s, as
/// bands in the chart's x unit (`per` ticks per unit).
fn state_bands(
    r: &RuleSeries,
    state: ShareState,
    color: &'static str,
    label: &str,
    per: f64,
) -> Vec<Band> {
    let i = state_index(state);
    let mut bands: Vec<Band> = Vec::new();
    let mut start = None;
    for (k, t) in r.ticks.iter().enumerate() {
        match (t.hosts[i] > 0, start) {
            (true, None) => start = Some(k),
            (false, Some(s)) => {
                push_band(&mut bands, s, k, color, label, per);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        push_band(&mut bands, s, r.ticks.len(), color, label, per);
    }
    bands
}

fn push_band(
    bands: &mut Vec<Band>,
    from: usize,
    to: usize,
    color: &'static str,
    label: &str,
    per: f64,
) {
    let (a, b) = (from as f64 / per, to as f64 / per);
    if let Some(last) = bands.last_mut() {
        if a - last.to < 10.0 / per {
            last.to = b;
            return;
        }
    }
    bands.push(Band {
        from: a,
        to: b,
        color,
        label: label.into(),
        strip: false,
    });
}

/// Per-second series averaged over `every` seconds, x in `unit` seconds.
fn per_second(r: &RuleSeries, every: usize, unit: f64, admitted: bool) -> Vec<(f64, f64)> {
    r.seconds
        .chunks(every.max(1))
        .enumerate()
        .map(|(i, c)| {
            let sum: u64 = c
                .iter()
                .map(|x| if admitted { x.admitted } else { x.offered })
                .sum();
            (
                ((i * every) as f64 + every as f64 / 2.0) / unit,
                sum as f64 / c.len() as f64,
            )
        })
        .collect()
}

/// 100 ms series between `from` and `to` seconds, as rates.
fn per_tick(
    run: &Run,
    r: &RuleSeries,
    from: f64,
    to: f64,
    f: impl Fn(&crate::metrics::Tick) -> f64,
) -> Vec<(f64, f64)> {
    let tick = run.tick_ns as f64 / NS_PER_S as f64;
    r.ticks
        .iter()
        .enumerate()
        .map(|(i, t)| ((i as f64 + 0.5) * tick, f(t)))
        .filter(|(x, _)| *x >= from && *x <= to)
        .collect()
}

fn marks(run: &Run, unit: f64) -> Vec<(f64, String)> {
    run.scenario
        .events
        .iter()
        .filter_map(|e| {
            e.label
                .as_ref()
                .map(|l| (e.at as f64 / NS_PER_S as f64 / unit, l.clone()))
        })
        .collect()
}

fn quota_line(q: u64) -> HLine {
    HLine {
        y: q as f64,
        label: format!("quota {}/s", svg::short_number(q as f64)),
        color: RED,
    }
}

/// The charts of one run: (file stem, chart).
pub fn charts(run: &Run) -> Vec<(String, Chart)> {
    let mut v = Vec::new();
    let name = run.scenario.name.as_str();
    let Some(c) = run.rule("contoso") else {
        return v;
    };
    let q = c.quota as f64;
    let secs = (run.scenario.duration / NS_PER_S) as f64;
    let tps = (NS_PER_S / run.tick_ns) as f64;
    let kind = name.split("-burst").next().unwrap_or(name);
    match kind {
        "steady" => {
            v.push((
                format!("{name}-contoso"),
                Chart {
                    title: format!(
                        "{}: Contoso admitted vs quota (10 s means)",
                        run.scenario.title
                    ),
                    x_label: "minutes".into(),
                    y_label: "frames per second".into(),
                    series: vec![
                        Series::new("offered", GREY, per_second(c, 10, 60.0, false)).dashed(),
                        Series::new("admitted", BLUE, per_second(c, 10, 60.0, true)),
                    ],
                    hlines: vec![quota_line(c.quota)],
                    y_max: Some(q * 1.4),
                    x_range: Some((0.0, secs / 60.0)),
                    ..Chart::default()
                },
            ));
        }
        "shift" | "flash" | "idle" => {
            let mut bands = state_bands(c, ShareState::Sticky, ORANGE, "STICKY", tps);
            bands.extend(state_bands(c, ShareState::FailOpen, RED, "FAIL_OPEN", tps));
            v.push((
                format!("{name}-contoso"),
                Chart {
                    title: format!("{}: Contoso admitted vs quota (1 s)", run.scenario.title),
                    x_label: "seconds".into(),
                    y_label: "frames per second".into(),
                    series: vec![
                        Series::new("offered", GREY, per_second(c, 1, 1.0, false)).dashed(),
                        Series::new("admitted", BLUE, per_second(c, 1, 1.0, true)),
                    ],
                    bands,
                    hlines: vec![quota_line(c.quota)],
                    marks: marks(run, 1.0),
                    y_max: Some(q * if name == "idle" { 3.0 } else { 1.7 }),
                    x_range: Some((0.0, secs)),
                },
            ));
        }
        n if n.starts_with("join") => {
            let at = claims::first_change(&run.scenario).unwrap_or(0) as f64 / NS_PER_S as f64;
            let end = claims::last_change(&run.scenario).unwrap_or(0) as f64 / NS_PER_S as f64;
            let end = end.max(at) + 4.0;
            v.push((
                format!("{name}-contoso"),
                Chart {
                    title: format!(
                        "{}, grant round trip {} ms: Contoso at 100 ms resolution",
                        run.scenario.title,
                        run.scenario.rtt / 1_000_000
                    ),
                    x_label: "seconds".into(),
                    y_label: "frames per second".into(),
                    series: vec![
                        Series::new(
                            "admitted (rate over 100 ms)",
                            BLUE,
                            per_tick(run, c, at - 2.0, end, |t| t.admitted as f64 * tps),
                        ),
                        Series::new(
                            "admitted before a first grant",
                            PURPLE,
                            per_tick(run, c, at - 2.0, end, |t| t.bootstrap_admitted as f64 * tps),
                        ),
                        Series::new(
                            "Σ enforced shares (BOOTSTRAP, LEASED, STICKY)",
                            GREEN,
                            per_tick(run, c, at - 2.0, end, |t| t.enforced() as f64),
                        )
                        .dashed(),
                    ],
                    hlines: vec![
                        quota_line(c.quota),
                        HLine {
                            y: q + 9_200.0,
                            label: "quota + 460 × 20 (design worst case)".into(),
                            color: ORANGE,
                        },
                    ],
                    marks: marks(run, 1.0),
                    x_range: Some((at - 2.0, end)),
                    ..Chart::default()
                },
            ));
        }
        "outage" => {
            let mut bands: Vec<Band> = claims::outages(&run.scenario)
                .iter()
                .map(|&(d, u)| Band {
                    from: d as f64 / NS_PER_S as f64 / 60.0,
                    to: u as f64 / NS_PER_S as f64 / 60.0,
                    color: GREY,
                    label: "allocator down".into(),
                    strip: true,
                })
                .collect();
            bands.extend(state_bands(
                c,
                ShareState::Sticky,
                ORANGE,
                "STICKY",
                tps * 60.0,
            ));
            bands.extend(state_bands(
                c,
                ShareState::FailOpen,
                RED,
                "FAIL_OPEN",
                tps * 60.0,
            ));
            v.push((
                format!("{name}-contoso"),
                Chart {
                    title: "Allocator outage with 460 joiners: Contoso (fail_mode open) admitted vs quota".into(),
                    x_label: "minutes".into(),
                    y_label: "frames per second".into(),
                    series: vec![
                        Series::new("offered", GREY, per_second(c, 1, 60.0, false)).dashed(),
                        Series::new("admitted", BLUE, per_second(c, 1, 60.0, true)),
                        Series::new("Σ enforced shares (not FAIL_OPEN)", GREEN, per_tick(run, c, 0.0, secs, |t| t.enforced() as f64).into_iter().map(|(x, y)| (x / 60.0, y)).collect()).dashed(),
                    ],
                    bands,
                    hlines: vec![
                        quota_line(c.quota),
                        HLine {
                            y: q + 9_200.0,
                            label: "quota + 460 × 20 = 19.2k (design worst case)".into(),
                            color: ORANGE,
                        },
                    ],
                    marks: marks(run, 60.0),
                    y_max: Some(q * 2.6),
                    x_range: Some((0.0, secs / 60.0)),
                },
            ));
            if let Some(d) = run.rule("directory") {
                let mut bands: Vec<Band> = claims::outages(&run.scenario)
                    .iter()
                    .map(|&(a, b)| Band {
                        from: a as f64 / NS_PER_S as f64 / 60.0,
                        to: b as f64 / NS_PER_S as f64 / 60.0,
                        color: GREY,
                        label: "allocator down".into(),
                        strip: true,
                    })
                    .collect();
                bands.extend(state_bands(
                    d,
                    ShareState::Sticky,
                    ORANGE,
                    "STICKY (static: held until recovery)",
                    tps * 60.0,
                ));
                v.push((
                    format!("{name}-directory"),
                    Chart {
                        title: "Allocator outage: Directory (fail_mode static) admitted vs its 2 M/s cap".into(),
                        x_label: "minutes".into(),
                        y_label: "frames per second".into(),
                        series: vec![
                            Series::new("offered", GREY, per_second(d, 1, 60.0, false)).dashed(),
                            Series::new("admitted", BLUE, per_second(d, 1, 60.0, true)),
                        ],
                        bands,
                        hlines: vec![quota_line(d.quota)],
                        marks: marks(run, 60.0),
                        y_max: Some(d.quota as f64 * 1.3),
                        x_range: Some((0.0, secs / 60.0)),
                    },
                ));
            }
        }
        "partition" | "restart" | "failover" => {
            let up = claims::outages(&run.scenario)
                .first()
                .map_or(0.0, |o| o.1 as f64 / NS_PER_S as f64);
            let down = claims::outages(&run.scenario)
                .first()
                .map_or(0.0, |o| o.0 as f64 / NS_PER_S as f64);
            let (from, to) = if name != "partition" {
                (down - 3.0, up + 8.0)
            } else {
                (up - 5.0, up + 5.0)
            };
            let mut bands = vec![Band {
                from: down,
                to: up,
                color: GREY,
                label: "allocator down".into(),
                strip: true,
            }];
            bands.extend(state_bands(c, ShareState::Sticky, ORANGE, "STICKY", tps));
            v.push((
                format!("{name}-contoso"),
                Chart {
                    title: format!(
                        "{}: Contoso around the allocator's return (100 ms)",
                        run.scenario.title
                    ),
                    x_label: "seconds".into(),
                    y_label: "frames per second".into(),
                    series: vec![
                        Series::new(
                            "admitted (rate over 100 ms)",
                            BLUE,
                            per_tick(run, c, from, to, |t| t.admitted as f64 * tps),
                        ),
                        Series::new(
                            "Σ enforced shares",
                            GREEN,
                            per_tick(run, c, from, to, |t| t.enforced() as f64),
                        )
                        .dashed(),
                    ],
                    bands,
                    hlines: vec![quota_line(c.quota)],
                    marks: marks(run, 1.0),
                    x_range: Some((from, to)),
                    ..Chart::default()
                },
            ));
        }
        _ => {}
    }
    v
}

const DEFINITIONS: &str = "\
## Definitions

- **Admitted vs quota** is measured per rule, fleet-wide, over aligned 1 s windows (the \
quota is per second). *Overshoot* = (admitted − quota) ÷ quota. A second is *over* when \
admitted exceeds the quota by more than 2 % (the tolerance of the fleet tests on real daemons). \
The configured burst can legitimately push a single second above the quota when buckets \
were idle; with demand above the quota they are empty, so the figures show allocation \
error, not burst.
- **False drops**: in a 1 s window where the rule's fleet-wide admitted count `a` is below \
its quota `Q`, a perfect global limiter would have admitted up to `Q − a` more frames; \
the window's false drops are `min(dropped, Q − a)`. Windows at or above the quota have \
none. Reported as a percentage of offered frames, over the seconds with the allocator up.
- **Time to converge** after a demand shift: whole seconds from the shift until admitted \
is within 2 % of `min(quota, offered)` (and not above quota + 2 %) for 3 consecutive \
seconds, divided by the report interval (1 s).
- **Σ enforced shares**: the sum of the rates the hosts' buckets enforce (BOOTSTRAP, \
LEASED and STICKY shares; FAIL_OPEN enforces nothing). It can exceed the quota while old \
leases are still in force; what is admitted also depends on demand.
- **Bootstrap phase**: frames admitted by hosts that have not had a grant yet.
- Statistics skip the first 10 s of each run (every host bootstraps at once).
";

const MODEL: &str = "\
## Model

- **Real code.** Every host runs limiter-fleet's `Share` per rule; the allocator runs one \
limiter-fleet `RuleAllocator` per rule; buckets are limiter-common GCRA (`Limit::new`, \
`conform`, `tat_with_tokens`) exactly as the kernel calls them, with the kernel's \
FAIL_OPEN check on the `fail_open_at` deadline. The daemon-side glue follows \
limiter-user's `policy/fleet/`: `held` is the share in LEASED/STICKY and 0 otherwise; a grant \
that takes a share out of BOOTSTRAP, FAIL_OPEN, a zero grant or a burst of 1 \
(`Share::takes_over`) sets the bucket's token count (≤ 1; 0 for a zero grant), a renewal keeps the TAT; out-of-cycle reports when `wants_early_report` (checked every \
100 ms, at most one per 200 ms).
- **Time.** Virtual nanoseconds in 1 ms steps; reports, grants and allocator events \
happen on steps. Hosts report on 10 phases of the 1 s interval (their daemons started at \
different times). The allocator answers each reporter with its grant: one allocation per \
rule per batch of reports arriving in the same step, then `RuleAllocator::grants_for`, \
which gives exactly what limiter-allocator's `grant_for` per report gives. A report reaches the allocator after half the round trip, the grant the \
host after the other half (50 ms round trip unless stated).
- **Traffic.** Each (rule, host) pair has an offered rate (the scenario's per-host rate × \
a fixed host weight, uniform in ±50 % unless stated). At ≤ 250 frames/s per host, \
arrivals are a Poisson process offered frame by frame to the exact GCRA (the Contoso \
buckets: a burst of 1 to 50 tokens, where each frame counts). Above that, arrivals are \
a dense stream and the admitted count per interval is computed in closed form \
(`Bucket::offer_even`, checked against per-frame GCRA in the tests); Directory's \
4,000/s per host is dense. Traffic is simulated lazily per pair: up to `now` whenever a \
grant, report or demand change touches the pair and at every metrics tick (100 ms for \
Contoso and Directory, 1 s for the background tenants).
- **Shares start** at a rule's first frame on a host, which asks for a grant at once \
claiming the bootstrap rate as demand (the design's joiner: a rule this host has not seen \
yet) — except in the `idle` scenario, which starts every configured rule when the daemon \
starts and reports it on the timer, as limiter-user does.
- **Outages.** A down allocator loses the reports that reach it; a restarted one is a new \
`RuleAllocator` per rule (learning for one lease TTL); a partitioned one keeps its state, \
and learns again at the first report after more than a lease TTL of silence. The \
allocator starts 60 s before the scenario and hears nothing until it starts, so each rule \
begins with one lease TTL of learning (inside the warm-up), as does a rule whose first \
report comes after more than a lease TTL with no host reporting it (a first frame; \
limiter-user reports idle rules, so there the allocator hears every configured rule).
- **Not modelled**: per-source limits, multiple CPUs (the kernel's CAS makes them \
equivalent to one sequential bucket), clock skew, report loss without an outage.
";

/// The bootstrap bound and the burst sweep, from the runs at hand.
fn derivations(o: &mut String, runs: &[Run]) {
    let joins: Vec<&Run> = runs
        .iter()
        .filter(|r| r.scenario.name.starts_with("join-"))
        .collect();
    if !joins.is_empty() {
        let _ = writeln!(
            o,
            "### What bootstrap adds

\
             A joiner bootstraps at r_b = quota ÷ fleet_size with one token and asks for a \
             grant at once; the grant arrives L later (the round trip, plus up to one 1 ms \
             simulation step). Meanwhile its bucket admits at most `1 + ⌊r_b × L⌋` frames \
             (the token, then one per 1/r_b). A first grant of 0 (the old leases still hold \
             the quota) is closed (nothing passes) until the old hosts have renewed and the \
             joiner's next report gets it a share, so nothing else comes on top: J joiners \
             within a second add at most `J × (1 + ⌊r_b × L⌋) ÷ quota` of a second of quota, \
             and the grants in force never exceed the quota. Per run (Contoso, quota \
             {} /s, r_b = {}/s):\n",
            joins[0].rule("contoso").map_or(0, |r| r.quota),
            joins[0].rule("contoso").map_or(0, |r| {
                limiter_fleet::share::Share::bootstrap_rate(
                    r.quota,
                    joins[0].scenario.params.fleet_size,
                )
            }),
        );
        let rows: Vec<Vec<String>> = joins
            .iter()
            .filter_map(|run| {
                let r = run.rule("contoso")?;
                let at = claims::first_change(&run.scenario)?;
                let j = claims::join_figures(run, r, at);
                Some(vec![
                    format!("`{}`", run.scenario.name),
                    format!("{}", j.joiners),
                    format!("{}", j.joins_peak_s),
                    format!(
                        "{} ms",
                        bootstrap::grant_latency(run.scenario.rtt) / 1_000_000
                    ),
                    format!("{}", j.per_joiner_bound),
                    format!(
                        "{:.2}",
                        j.bootstrap_admitted as f64 / f64::from(j.joiners.max(1))
                    ),
                    format!("{:.2} %", j.bound_peak_s_pct),
                    format!("{:.2} %", j.bootstrap_peak_s_pct),
                    fmt_pct(j.peak_pct),
                    format!("{:.1} %", j.granted_peak_pct),
                ])
            })
            .collect();
        md_table(
            o,
            &[
                "scenario",
                "joiners",
                "most joins in 1 s",
                "L",
                "bound per joiner (frames)",
                "simulated per joiner",
                "bound, worst second",
                "bootstrap admitted, worst second",
                "rule's 1 s peak",
                "grants in force (peak)",
            ],
            &rows,
        );
        if let Some(run) = joins.first() {
            let q = run.rule("contoso").map_or(0, |r| r.quota);
            let per_s = bootstrap::joins_per_s_for(
                BOOTSTRAP_CLAIM_PCT,
                q,
                run.scenario.params.fleet_size,
                50 * MS,
            );
            let _ = writeln!(
                o,
                "So the design's ~{} % with a 50 ms grant is the bound for up to {per_s} joins \
                 a second (each joiner admits less than the bound on average: a second frame \
                 needs an arrival in the last millisecond of its bootstrap). Joiners arriving \
                 together add their count × (1 + ⌊r_b × L⌋) whatever the allocator does — \
                 their single tokens alone are joiners ÷ quota.\n",
                BOOTSTRAP_CLAIM_PCT
            );
        }
    }
    let sweep = claims::burst_sweep(runs);
    if !sweep.is_empty() {
        let _ = writeln!(
            o,
            "### Admitted vs burst (steady, Contoso alone, demand ≈ 120 % of the quota)\n\n\
             The allocator gives each host burst × share ÷ quota tokens; with shares of ≈ \
             quota ÷ hosts each, that is about global burst ÷ hosts.\n"
        );
        let rows: Vec<Vec<String>> = sweep
            .iter()
            .map(|p| {
                vec![
                    format!("`{}`", p.scenario),
                    format!("{}", p.burst),
                    format!("{:.0}", p.tokens_per_host),
                    format!("{:.1}", p.offered_per_host),
                    format!("{:.1} %", p.admitted_pct),
                    format!("{:.2} %", p.false_pct),
                    fmt_pct(p.overshoot_pct),
                ]
            })
            .collect();
        md_table(
            o,
            &[
                "scenario",
                "global burst",
                "tokens per host",
                "offered per host /s",
                "admitted ÷ quota",
                "false drops (of offered)",
                "max 1 s overshoot",
            ],
            &rows,
        );
    }
    candidates_section(o, runs);
}

/// Issue 17's candidates: each `base+LABEL` run against its base (the winners).
fn candidates_section(o: &mut String, runs: &[Run]) {
    let points = claims::candidates(runs);
    if points.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "### Accuracy candidates\n\n\
         Each row runs a scenario with a candidate that lost, or without one of the winners \
         (`nocredit`: no credit; `tokens`: the credit added to the bucket, at most its burst; \
         `bank-Npct`: the credit bank with a cap of N % of an interval's quota; `all-unused`: every host's \
         unused share feeds the credit, also where demand fell; `nojoiners`: no joiner's \
         share while the allocator learns; `norearm`: a host whose report fails does not \
         re-arm its last credit; `noretry`: a host in FAIL_OPEN retries its report once an \
         interval, not every 200 ms; `quiet`: a host whose demand left reports demand 0 at \
         once, a candidate the daemon does not run), beside the same scenario with the winners \
         (credit bank, cap {} % of an interval's quota; a joiner's share while learning). Contoso; \
         admitted ÷ quota over the seconds offered ≥ 105 % of it.\n",
        limiter_fleet::alloc::DEFAULT_CREDIT_PCT
    );
    let back = |v: &[Option<f64>]| {
        if v.is_empty() {
            "–".to_string()
        } else {
            v.iter()
                .map(|a| a.map_or("never".to_string(), |a| format!("{a:.0}")))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let pct = |a: Option<f64>| a.map_or("–".to_string(), |a| format!("{a:.1} %"));
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                format!("`{}`", p.scenario),
                format!("{} / {}", pct(p.admitted_pct[0]), pct(p.admitted_pct[1])),
                format!("{:.2} % / {:.2} %", p.false_pct[0], p.false_pct[1]),
                format!(
                    "{} / {}",
                    fmt_pct(p.overshoot_pct[0]),
                    fmt_pct(p.overshoot_pct[1])
                ),
                format!("{} / {}", pct(p.lowest_pct[0]), pct(p.lowest_pct[1])),
                format!(
                    "{} / {}",
                    back(&p.admitted_back[0]),
                    back(&p.admitted_back[1])
                ),
            ]
        })
        .collect();
    md_table(
        o,
        &[
            "run (candidate / winners)",
            "admitted ÷ quota",
            "false drops (of offered)",
            "max 1 s overshoot",
            "lowest 1 s ÷ quota",
            "admitted back within 2 % (intervals after each shift)",
        ],
        &rows,
    );
}

/// Writes `report.md` and the SVG plots to `dir`.
pub fn write(dir: &Path, runs: &[Run], total_wall: Duration, command: &str) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut o = String::new();
    let _ = writeln!(o, "# limiter fleet simulation\n");
    let simulated: u64 = runs.iter().map(|r| r.scenario.duration / NS_PER_S).sum();
    let _ = writeln!(
        o,
        "Generated by `{command}` (crate limiter-sim): {} scenarios, {} s ({:.1} h) of \
         simulated time for 500 hosts in {:.1} s of wall time.\n",
        runs.len(),
        simulated,
        simulated as f64 / 3600.0,
        total_wall.as_secs_f64()
    );
    let _ = writeln!(o, "## Summary\n");
    let rows: Vec<Vec<String>> = rows(runs).iter().map(|r| cells(r).to_vec()).collect();
    md_table(&mut o, &HEADER, &rows);
    let _ = writeln!(o, "## The design's claims (docs/design.md)\n");
    let claims = claims::claims(runs);
    let rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| {
            vec![
                c.source.to_string(),
                c.claim.clone(),
                format!("`{}`", c.scenario),
                c.expected.clone(),
                c.simulated.clone(),
                match c.verdict {
                    Verdict::Holds => "✅ holds".into(),
                    Verdict::Fails => "❌ fails".into(),
                },
            ]
        })
        .collect();
    md_table(
        &mut o,
        &[
            "source",
            "claim",
            "scenario",
            "expected",
            "simulated",
            "verdict",
        ],
        &rows,
    );
    let mut whys: Vec<&str> = Vec::new();
    for c in claims
        .iter()
        .filter(|c| c.verdict == Verdict::Fails && !c.why.is_empty())
    {
        if !whys.contains(&c.why) {
            whys.push(c.why);
            let _ = writeln!(o, "- **{}** — {}\n", c.claim, c.why);
        }
    }
    derivations(&mut o, runs);
    let _ = writeln!(o, "## Scenarios\n");
    for run in runs {
        let sc = &run.scenario;
        let _ = writeln!(o, "### `{}` — {}\n", sc.name, sc.title);
        let _ = writeln!(
            o,
            "{} ({} s simulated, round trip {} ms, wall {:.2} s.)\n",
            sc.about,
            sc.duration / NS_PER_S,
            sc.rtt / 1_000_000,
            run.wall.as_secs_f64()
        );
        let mut rows = Vec::new();
        for r in run.rules.iter().filter(|r| r.tracked) {
            let f = rule_figures(run, r);
            rows.push(vec![
                r.name.clone(),
                svg::short_number(r.quota as f64),
                format!(
                    "{} at {} s",
                    fmt_pct(f.overshoot_up.max_pct),
                    f.overshoot_up.at
                ),
                format!(
                    "{} s (longest {} s)",
                    f.overshoot_up.secs_over, f.overshoot_up.longest
                ),
                f.overshoot_outage.map_or("–".into(), |o| {
                    format!("{} ({} s over)", fmt_pct(o.max_pct), o.secs_over)
                }),
                f.saturated_admitted_pct
                    .map_or("–".into(), |p| format!("{p:.1} %")),
                format!(
                    "{} of {} ({:.2} %)",
                    f.drops_up.false_drops,
                    f.drops_up.offered,
                    f.drops_up.false_pct_of_offered()
                ),
                f.enforced_peak_pct
                    .map_or("–".into(), |p| format!("{p:.0} %")),
            ]);
        }
        if rows
            .iter()
            .any(|r| r[5] != "–" || r[6] != "0 of 0 (0.00 %)")
        {
            md_table(
                &mut o,
                &[
                    "rule",
                    "quota/s",
                    "max overshoot (allocator up)",
                    "seconds > 2 % over",
                    "max overshoot (outage)",
                    "admitted when offered > quota",
                    "false drops",
                    "peak Σ enforced shares",
                ],
                &rows,
            );
        }
        for (stem, chart) in charts(run) {
            let file = format!("{stem}.svg");
            fs::write(dir.join(&file), svg::render(&chart))
                .with_context(|| format!("writing {}", dir.join(&file).display()))?;
            let _ = writeln!(o, "![{}]({file})\n", chart.title);
        }
    }
    o.push_str(DEFINITIONS);
    o.push('\n');
    o.push_str(MODEL);
    let path = dir.join("report.md");
    fs::write(&path, o).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
