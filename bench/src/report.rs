//! `target/bench/report.md` and its plots, from whatever parts of the benchmark ran.
//! A measurement that failed its checks appears as INVALID with the reason, and counts
//! towards [`Written::invalid`] so the benchmark can fail after writing the report.

use std::{fmt::Write as _, fs, path::Path};

use anyhow::{Context as _, Result};
use limiter_plot::{render, short_number, Chart, Series, Style};

use super::{
    accuracy::{
        self, Accuracy, CaseResult, SweepPoint, Timeline, BURST_BURST, BURST_RATE, BURST_SAMPLE,
        SWEEP_BURST, SWEEP_RATE,
    },
    cpu_cost::{self, CostRow, CostTable, Job},
    drop_rate::{self, DropRateRow},
    gen::Backend,
    stats::Spread,
    Results,
};

pub const REPORT: &str = "report.md";
pub const SWEEP_SVG: &str = "admitted-vs-offered.svg";
pub const BURST_SVG: &str = "burst.svg";

/// What was written.
pub struct Written {
    pub markdown: String,
    /// Target lines (also in the report), for the console.
    pub targets: Vec<String>,
    /// Measurements that failed their checks.
    pub invalid: usize,
}

/// Environment lines at the top of the report.
pub struct Context {
    pub command: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub elapsed_s: f64,
    /// Relative link to the BPF_PROG_TEST_RUN report, if it was written in this run.
    pub prog_test_run: Option<String>,
}

/// Writes the report and plots into `dir`.
pub fn write(dir: &Path, ctx: &Context, results: &Results) -> Result<Written> {
    let mut doc = Doc::default();
    doc.header(ctx);
    if let Some(rows) = &results.drop_rate {
        doc.drop_rate(rows);
    }
    if let Some(tables) = &results.cpu_cost {
        doc.cpu_cost(tables);
    }
    if let Some(acc) = &results.accuracy {
        doc.accuracy(acc);
        write_plots(dir, acc)?;
    }
    let markdown = doc.finish();
    let path = dir.join(REPORT);
    fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    Ok(Written {
        markdown,
        targets: doc.targets,
        invalid: doc.invalid,
    })
}

#[derive(Default)]
struct Doc {
    body: String,
    targets: Vec<String>,
    invalid: usize,
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn mpps(v: f64) -> String {
    format!("{:.3} M/s", v / 1e6)
}

impl Doc {
    fn line(&mut self, text: &str) {
        self.body.push_str(text);
        self.body.push('\n');
    }

    fn target(&mut self, text: String) {
        self.targets.push(text);
    }

    /// A failed measurement as a row of a table with `columns` columns.
    fn failed_row(&mut self, what: &str, error: &anyhow::Error, columns: usize) {
        self.invalid += 1;
        let reason = format!("{error:#}").replace('|', "\\|");
        let rest = " |".repeat(columns.saturating_sub(2));
        self.line(&format!("| **INVALID** | {reason} |{rest}"));
        self.target(format!("{what}: INVALID, not measured ({error:#})"));
    }

    fn failed(&mut self, what: &str, error: &anyhow::Error) {
        self.invalid += 1;
        self.line(&format!("**INVALID — {what}:** `{error:#}`\n"));
        self.target(format!("{what}: INVALID, not measured ({error:#})"));
    }

    fn finish(&self) -> String {
        let mut out = String::new();
        let (head, rest) = self
            .body
            .split_once("<!-- targets -->\n")
            .unwrap_or(("", &self.body));
        out.push_str(head);
        out.push_str("## Targets\n\n");
        for t in &self.targets {
            let _ = writeln!(out, "- {t}");
        }
        if self.invalid > 0 {
            let _ = writeln!(
                out,
                "- **{} measurement(s) INVALID** (see below): the run failed",
                self.invalid
            );
        }
        out.push('\n');
        out.push_str(rest);
        out
    }

    fn header(&mut self, ctx: &Context) {
        self.line("# limiter: end-to-end benchmark\n");
        self.line(&format!(
            "`{}` — kernel {}, {} × {}, {:.0} s in all. Frames cross a veth pair from a \
             network namespace to the host end, where the program under test is attached in \
             native mode; every figure is compared with a reference measured in the same run \
             on the same path with the same generator.\n",
            ctx.command, ctx.kernel, ctx.cpus, ctx.cpu_model, ctx.elapsed_s
        ));
        if let Some(link) = &ctx.prog_test_run {
            self.line(&format!(
                "Per-path cost of the program alone (BPF_PROG_TEST_RUN): [{link}]({link}).\n"
            ));
        }
        self.line("Generators (both from the project's harness, two senders pinned to CPUs 0 and 1, a two-queue pair):\n");
        self.line("- **AF_PACKET** (`sendmmsg`, qdisc bypass): frames arrive as socket buffers; veth copies each into a page before XDP runs.");
        self.line("- **live frames** (`BPF_PROG_TEST_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`, an XDP_TX program on the peer): frames arrive as XDP frames, the path a NIC driver gives. Each sender keeps its program attached (generic mode) to an idle veth pair of its own, so that a call does not add it to the kernel's XDP dispatcher and remove it again (each change waits ≈ 24 ms for RCU, idle); 2^20 frames per call unpaced, one lump per call when paced.\n");
        self.line("<!-- targets -->");
    }

    // ---------------------------------------------------------------------------------
    // 1. drop rate

    fn drop_rate(&mut self, rows: &Result<Vec<DropRateRow>>) {
        self.line("## 1. Drop rate: limiter vs plain XDP_DROP\n");
        self.line(&format!(
            "Both senders as fast as they go, from {} sources in turn; rule `{}` (almost every \
             frame over it); the \
             rate is the host end's `rx_packets` (every frame XDP ran on) over a 1.2 s window \
             after 0.4 s of warm-up. Each round runs XDP_DROP, the limiter, then the limiter sampling; 3 rounds, \
             median (min–max) of the undisturbed ones. The rule's counters must account for \
             every frame and have dropped ≥ 99 % of them. **per CPU-second**: the same \
             ratio with frames divided by the CPU time of the senders (and the softirq work \
             in their context) and ksoftirqd instead of wall time — the cost ratio, immune \
             to other load and to the live generator's idle gaps. A round is *disturbed* \
             when more than {:.1} CPUs of other work ran beside it. The target is judged on \
             frames/s from undisturbed rounds, or on the per-CPU-second ratio when every \
             round was disturbed.\n",
            drop_rate::FLOOD_SOURCES,
            drop_rate::RULE.replace('\n', ", "),
            drop_rate::DISTURBED
        ));
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return self.failed("drop rate", e),
        };
        self.line("| generator | XDP_DROP frames/s | limiter frames/s | limiter ÷ XDP_DROP | per CPU-second | disturbed rounds |");
        self.line("|---|---:|---:|---:|---:|---:|");
        for row in rows {
            if let Err(e) = self.drop_rate_row(row) {
                self.failed(&format!("drop rate, {}", row.backend.label()), &e);
            }
        }
        self.line(&format!(
            "\nThe same rounds with sampling on: the limiter sampling its refusals at {} \
             events/s per CPU, the ring buffer drained by a thread as `limiter monitor` \
             drains it (each run checked: at most the budget written, every other refusal \
             counted as skipped, none lost). On ÷ off, the cost of sampling under a flood:\n",
            drop_rate::SAMPLING_BUDGET
        ));
        self.line("| generator | sampling off frames/s | sampling on frames/s | on ÷ off | per CPU-second |");
        self.line("|---|---:|---:|---:|---:|");
        for row in rows {
            if let Err(e) = self.sampling_row(row) {
                self.failed(
                    &format!("drop rate with sampling, {}", row.backend.label()),
                    &e,
                );
            }
        }
        let delivered: Vec<String> = rows
            .iter()
            .map(|r| format!("{} {:.1} %", r.backend.label(), r.min_delivered * 100.0))
            .collect();
        self.line(&format!(
            "\nFrames sent that reached XDP (lowest run): {}; the rest the veth refused \
             when its ring was full.\n",
            delivered.join(", ")
        ));
    }

    fn sampling_row(&mut self, row: &DropRateRow) -> Result<()> {
        let mega =
            |s: Spread| format!("{} ({:.2}–{:.2})", mpps(s.median), s.min / 1e6, s.max / 1e6);
        self.line(&format!(
            "| {} | {} | {} | **{}** | {} |",
            row.backend.label(),
            mega(row.limiter()?),
            mega(row.sampling()?),
            row.sampling_ratio()?.show(2),
            row.sampling_cpu_ratio()?.show(2),
        ));
        Ok(())
    }

    fn drop_rate_row(&mut self, row: &DropRateRow) -> Result<()> {
        let (x, l) = (row.xdp_drop()?, row.limiter()?);
        let (ratio, cpu_ratio) = (row.ratio()?, row.cpu_ratio()?);
        let mega =
            |s: Spread| format!("{} ({:.2}–{:.2})", mpps(s.median), s.min / 1e6, s.max / 1e6);
        self.line(&format!(
            "| {} | {} | {} | **{}** | {} | {}/{} |",
            row.backend.label(),
            mega(x),
            mega(l),
            ratio.show(2),
            cpu_ratio.show(2),
            row.disturbed_rounds(),
            row.rounds.len()
        ));
        let (judged, reading) = row.target_ratio()?;
        self.target(format!(
            "drop rate ≥ {:.1}× plain XDP_DROP, {}: {judged:.2}× ({reading}; frames/s {:.2}×, \
             per CPU-second {:.2}×) — {}",
            drop_rate::TARGET,
            row.backend.label(),
            ratio.median,
            cpu_ratio.median,
            met(row.met()?)
        ));
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // 2. CPU cost

    fn cpu_cost(&mut self, tables: &Result<Vec<CostTable>>) {
        self.line("## 2. CPU time per frame: limiter vs nftables\n");
        self.line(&format!(
            "A paced offer of {}k frames/s ({} senders × {}k), below saturation, from {} \
             sources in turn (on the live path one source per call, thousands of frames \
             each). Rules, the same job for both: aggregate = `limit rate over {}/second \
             burst {} packets` vs limiter `rate = {}`, `burst = {}`; per source = a dynamic \
             set keyed by `ip saddr` with `limit rate over {}/second burst {} packets` vs \
             limiter `[rules.per_source]` `rate = {}`, `burst = {}`; both match UDP to the \
             host address, nftables in a netdev ingress chain on the host end. A sample \
             whose offer reached the interface more than 20 % off (the generator starved \
             by other load) is measured again, then counted as failed; a row needs 2 valid \
             samples.\n",
            cpu_cost::RATE_PER_SENDER * 2 / 1000,
            2,
            cpu_cost::RATE_PER_SENDER / 1000,
            cpu_cost::SOURCES,
            cpu_cost::AGG_RATE,
            cpu_cost::AGG_BURST,
            cpu_cost::AGG_RATE,
            cpu_cost::AGG_BURST,
            cpu_cost::SRC_RATE,
            cpu_cost::SRC_BURST,
            cpu_cost::SRC_RATE,
            cpu_cost::SRC_BURST,
        ));
        self.line(&format!(
            "Two readings per 1 s window (3 interleaved rounds, median (min–max)): \
             **all CPUs** = busy time from /proc/stat (user + system + irq + softirq, every \
             CPU) minus the idle reference load measured just before each round, ÷ frames; \
             **own** = scheduler runtime (`/proc/…/schedstat`, ns) of this process's threads \
             (the senders, and the softirq work the kernel does in their context) and of \
             `ksoftirqd`, ÷ frames. /proc/stat here is sampled by a 250 Hz tick and sees any \
             other work on the machine; a sample with more than {:.2} CPUs of other load (in \
             the idle reference or beside the measurement) is *disturbed* and left out of \
             the all-CPUs figure, which needs {} undisturbed samples. The verdicts use the \
             own reading: exact and blind to other load, while the tick-sampled /proc/stat \
             strays even undisturbed (the generators sleep periodically and alias with the \
             tick; compare the columns where both exist, worst on the live path). The \
             generator's own cost is in every row: compare the **Δ vs XDP_DROP** columns. \
             On the AF_PACKET path the limiter runs twice: its XDP build, and its TC build \
             at TC ingress (`xdp_mode = \"tc\"`), where no XDP program makes veth copy \
             each skb into a page first; *plain TC ingress drop* is what any TC program \
             starts from there.\n",
            cpu_cost::DISTURBED,
            cpu_cost::MIN_CLEAN
        ));
        let tables = match tables {
            Ok(t) => t,
            Err(e) => return self.failed("CPU cost", e),
        };
        for table in tables {
            if let Err(e) = self.cpu_table(table) {
                self.failed(&format!("CPU cost, {}", table.backend.label()), &e);
            }
        }
    }

    fn cpu_row(
        &mut self,
        row: &CostRow,
        own: Spread,
        drop_machine: Option<f64>,
        drop_own: Option<f64>,
    ) {
        let machine = row.machine_ns();
        let fps = row.samples.iter().map(|s| s.frames_per_second).sum::<f64>()
            / row.samples.len().max(1) as f64;
        let dropped = row
            .samples
            .iter()
            .filter_map(|s| s.dropped)
            .fold(None, |acc: Option<f64>, d| {
                Some(acc.map_or(d, |a| a.min(d)))
            });
        let delta = |value: f64, reference: Option<f64>| {
            reference.map_or("—".into(), |r| format!("{:+.0}", value - r))
        };
        let failed = if row.failures.is_empty() {
            String::new()
        } else {
            format!(", {} failed", row.failures.len())
        };
        self.line(&format!(
            "| {} | {}k | {} | {} | {} | {} | {} | {}/{}{failed} |",
            row.label,
            (fps / 1000.0).round(),
            machine.map_or("— (disturbed)".into(), |s| s.show(0)),
            machine.map_or("—".into(), |m| delta(m.median, drop_machine)),
            own.show(0),
            delta(own.median, drop_own),
            dropped.map_or("—".into(), |d| format!("{:.1} %", d * 100.0)),
            row.disturbed_samples(),
            row.samples.len()
        ));
    }

    fn cpu_table(&mut self, table: &CostTable) -> Result<()> {
        self.line(&format!("### {}\n", table.backend.label()));
        self.line("| host end | frames/s | ns/frame, all CPUs | Δ vs XDP_DROP | ns/frame, own | Δ vs XDP_DROP | dropped | disturbed / valid samples |");
        self.line("|---|---:|---:|---:|---:|---:|---:|---:|");
        let drop = table.xdp_drop()?;
        let drop_machine = drop.machine_ns().map(|s| s.median);
        let drop_own = drop.own_ns().ok().map(|s| s.median);
        for row in &table.rows {
            match row.own_ns() {
                Ok(own) => self.cpu_row(row, own, drop_machine, drop_own),
                Err(e) => {
                    self.line(&format!("| {} | INVALID | | | | | | |", row.label));
                    self.invalid += 1;
                    self.target(format!(
                        "CPU cost, {}: INVALID, not measured ({e:#})",
                        table.backend.label()
                    ));
                }
            }
        }
        let idle: Vec<String> = table.idle.iter().map(|l| format!("{l:.2}")).collect();
        self.line(&format!(
            "\nIdle reference load per round (CPUs): {}.\n",
            idle.join(", ")
        ));
        for v in table.verdicts()? {
            let job = match v.job {
                Job::Aggregate => "aggregate `limit`",
                Job::PerSource => "per-source meter",
                Job::None => "—",
            };
            let noise = if v.within_noise() {
                format!(
                    ", a difference within the samples' spread (±{:.0} ns)",
                    v.noise_ns
                )
            } else {
                String::new()
            };
            let text = format!(
                "cheaper per frame than nftables ({job}), {}, {} build: limiter {:.0} ns vs \
                 nftables {:.0} ns; over XDP_DROP {:+.0} vs {:+.0} ns (own runtime{noise}) — {}",
                table.backend.label(),
                v.build,
                v.limiter_ns,
                v.nft_ns,
                v.limiter_ns - v.xdp_drop_ns,
                v.nft_ns - v.xdp_drop_ns,
                met(v.met())
            );
            // The target is judged on the build meant for each path: XDP for XDP frames
            // (a NIC driver's path), TC for frames born as socket buffers, where an XDP
            // program costs veth's copy into a page. The other comparison is shown too.
            let meant = match table.backend {
                Backend::AfPacket => "TC",
                Backend::Live | Backend::LiveSpray | Backend::LiveSpraySet(_) => "XDP",
            };
            if v.build == meant {
                self.target(text);
            } else {
                self.line(&format!(
                    "- not a target (the {} build on this path): {text}\n",
                    v.build
                ));
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // 3. accuracy

    fn accuracy(&mut self, acc: &Accuracy) {
        self.line("## 3. Accuracy: admitted vs configured\n");
        self.line("AF_PACKET senders paced in 1 ms lumps on both CPUs; each run loads the rule fresh (full bucket). Checks: the rule's passed + dropped equals what the interface received, a TC ingress counter behind XDP received exactly what the rule passed, nothing went unmetered (`contended`, `insert_failures`).\n");
        self.line("**Exact** = what an exact token bucket (same rate and burst, full at the start) admits from the arrivals as measured: the frames reaching XDP are sampled every 10 ms and fed to a fluid bucket. With a perfectly steady overload it equals min(offered, rate × T + burst), T = first to last frame sent (shown too); when other load on the machine stalls a sender, the offer dips below the rate, the bucket refills and loses tokens, and both the real and the exact bucket admit less.\n");
        self.line("### Each rate offered at 2× for 2 s\n");
        self.line("Bursts are 20 ms of the rate.\n");
        self.line(
            "| rule | burst | offered | admitted | exact | rate × T + burst | admitted ÷ exact |",
        );
        self.line("|---|---:|---:|---:|---:|---:|---:|");
        let mut worst: Option<f64> = None;
        let mut all_valid = true;
        for case in &acc.cases {
            match case {
                Ok(c) => {
                    self.case_row(c);
                    let err = (c.ratio() - 1.0).abs();
                    worst = Some(worst.map_or(err, |w| w.max(err)));
                }
                Err(e) => {
                    all_valid = false;
                    self.failed_row("accuracy", e, 7);
                }
            }
        }
        if let Some(w) = worst {
            self.target(format!(
                "accuracy within {:.0} % at every rate: worst {:.3} %{} — {}",
                accuracy::TARGET * 100.0,
                w * 100.0,
                if all_valid {
                    ""
                } else {
                    " (some rates INVALID)"
                },
                met(w <= accuracy::TARGET && all_valid)
            ));
        }
        self.line("");
        self.sweep(&acc.sweep);
        self.timeline(&acc.timeline);
    }

    fn case_row(&mut self, c: &CaseResult) {
        let unit = if c.case.bytes { " B" } else { "" };
        self.line(&format!(
            "| {} | {}{unit} | {:.2}× | {}{unit} | {:.0}{unit} | {:.0}{unit} | **{:.5}** |",
            c.case.label,
            c.case.burst,
            c.offered_multiple,
            c.admitted,
            c.expected,
            c.continuous,
            c.ratio()
        ));
    }

    fn sweep(&mut self, points: &[Result<SweepPoint>]) {
        self.line(&format!(
            "### Admitted vs offered: rule `rate = {SWEEP_RATE}`, `burst = {SWEEP_BURST}`, 1.5 s per point\n"
        ));
        self.line(&format!("![admitted vs offered]({SWEEP_SVG})\n"));
        self.line("Exact = an exact bucket on the measured arrivals, per second (min(offered, rate + burst ÷ T) for a steady offer).\n");
        self.line("| offered ÷ rate | offered frames/s | admitted frames/s | exact | admitted ÷ exact | dropped |");
        self.line("|---:|---:|---:|---:|---:|---:|");
        for p in points {
            match p {
                Ok(p) => self.line(&format!(
                    "| {:.2} | {:.0} | {:.0} | {:.0} | {:.5} | {} |",
                    p.multiple,
                    p.offered,
                    p.admitted,
                    p.ideal,
                    p.admitted / p.ideal,
                    p.dropped
                )),
                Err(e) => self.failed_row("sweep point", e, 6),
            }
        }
        let below: Vec<&SweepPoint> = points
            .iter()
            .filter_map(|p| p.as_ref().ok())
            .filter(|p| p.multiple <= 1.0)
            .collect();
        if !below.is_empty() {
            let lost: u64 = below.iter().map(|p| p.dropped).sum();
            self.target(format!(
                "nothing dropped at or below the rate (sweep, {} points): {lost} dropped — {}",
                below.len(),
                met(lost == 0)
            ));
        }
        self.line("");
    }

    fn timeline(&mut self, timeline: &Result<Timeline>) {
        self.line(&format!(
            "### Burst: rule `rate = {BURST_RATE}`, `burst = {BURST_BURST}`, hit from idle at 2×\n"
        ));
        match timeline {
            Ok(t) => {
                self.line(&format!("![burst]({BURST_SVG})\n"));
                let last = t.points.last().copied().unwrap_or_default();
                self.line(&format!(
                    "The passed counter sampled every {} ms for {:.2} s ({} samples): the \
                     bucket's {BURST_BURST} frames go at the offered rate, then the slope is \
                     the rule's rate. At the end: offered {}, admitted {}, an exact limiter \
                     {:.0}.\n",
                    BURST_SAMPLE.as_millis(),
                    t.span,
                    t.points.len(),
                    last.1,
                    last.2,
                    Timeline::ideal(last.0, last.1)
                ));
            }
            Err(e) => self.failed("burst timeline", e),
        }
    }
}

fn write_plots(dir: &Path, acc: &Accuracy) -> Result<()> {
    let points: Vec<&SweepPoint> = acc.sweep.iter().filter_map(|p| p.as_ref().ok()).collect();
    if !points.is_empty() {
        save(dir, SWEEP_SVG, &sweep_plot(&points))?;
    }
    if let Ok(t) = &acc.timeline {
        save(dir, BURST_SVG, &burst_plot(t))?;
    }
    Ok(())
}

fn save(dir: &Path, name: &str, chart: &Chart) -> Result<()> {
    let path = dir.join(name);
    fs::write(&path, render(chart)).with_context(|| format!("writing {}", path.display()))
}

fn sweep_plot(points: &[&SweepPoint]) -> Chart {
    let max = points.iter().map(|p| p.offered).fold(0.0, f64::max);
    let ceiling = points
        .iter()
        .map(|p| p.ideal)
        .fold(0.0, f64::max)
        .max(SWEEP_RATE as f64);
    Chart {
        title: format!(
            "Admitted vs offered, rule {} frames/s (burst {})",
            short_number(SWEEP_RATE as f64),
            short_number(SWEEP_BURST as f64)
        ),
        x_label: "offered (frames/s reaching XDP)".into(),
        y_label: "admitted (frames/s)".into(),
        series: vec![
            // The steady-offer line; the table has each point's exact figure.
            Series::new(
                "exact limiter: min(offered, rate + burst/T)",
                "#d62728",
                vec![(0.0, 0.0), (ceiling, ceiling), (max, ceiling)],
            )
            .dashed(),
            Series::new(
                "limiter, measured",
                "#1f77b4",
                points.iter().map(|p| (p.offered, p.admitted)).collect(),
            )
            .styled(Style::Markers),
        ],
        ..Chart::default()
    }
}

fn burst_plot(t: &Timeline) -> Chart {
    // Every curve starts at the first frame with nothing offered or admitted.
    let origin = (0.0, 0, 0);
    let series = |name: &str, color, style, f: &dyn Fn(&(f64, u64, u64)) -> f64| {
        let points = std::iter::once(&origin)
            .chain(&t.points)
            .map(|p| (p.0, f(p)))
            .collect();
        Series::new(name, color, points).styled(style)
    };
    Chart {
        title: format!(
            "Burst from idle: rule {}/s, burst {}, offered 2×",
            short_number(BURST_RATE as f64),
            short_number(BURST_BURST as f64)
        ),
        x_label: "seconds since the first frame".into(),
        y_label: "frames (cumulative)".into(),
        series: vec![
            series("offered", "#7f7f7f", Style::Line, &|p| p.1 as f64),
            series("admitted (passed counter)", "#1f77b4", Style::Wide, &|p| {
                p.2 as f64
            }),
            // On top, so it shows where it coincides with the measurement.
            series(
                "exact limiter: min(offered, burst + rate·t)",
                "#d62728",
                Style::Dashed,
                &|p| Timeline::ideal(p.0, p.1),
            ),
        ],
        ..Chart::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vertices of each `<path>` in a rendered chart.
    fn path_lengths(svg: &str) -> Vec<usize> {
        svg.lines()
            .filter(|l| l.starts_with("<path"))
            .map(|l| l.matches(['M', 'L']).count())
            .collect()
    }

    #[test]
    fn the_sweep_plot_shows_every_measured_point() {
        let points: Vec<SweepPoint> = [0.5, 1.0, 2.0, 4.0]
            .into_iter()
            .map(|multiple| {
                let offered = multiple * SWEEP_RATE as f64;
                SweepPoint {
                    multiple,
                    offered,
                    admitted: offered.min(SWEEP_RATE as f64),
                    ideal: offered.min(SWEEP_RATE as f64),
                    dropped: 0,
                }
            })
            .collect();
        let svg = render(&sweep_plot(&points.iter().collect::<Vec<_>>()));
        // One dot a measurement and one in the legend; the exact limiter's line whole.
        assert_eq!(svg.matches("<circle").count(), points.len() + 1);
        assert_eq!(path_lengths(&svg), [3]);
        assert!(svg.contains("stroke-dasharray"));
        assert!(!svg.contains("off scale"));
    }

    #[test]
    fn the_burst_plot_draws_each_curve_from_the_origin() {
        let points: Vec<(f64, u64, u64)> = (1..=20u64)
            .map(|i| {
                let t = i as f64 * 0.05;
                let offered = (2.0 * BURST_RATE as f64 * t) as u64 + BURST_BURST;
                (t, offered, Timeline::ideal(t, offered) as u64)
            })
            .collect();
        let t = Timeline { points, span: 1.0 };
        let svg = render(&burst_plot(&t));
        let n = t.points.len() + 1;
        assert_eq!(path_lengths(&svg), [n, n, n]);
        assert_eq!(
            svg.matches(r#"stroke-width="5""#).count(),
            2,
            "the wide line and its legend"
        );
    }
}
