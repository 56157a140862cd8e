//! The screen of `limiter top`, drawn from [`Rates`] into a ratatui frame (no terminal
//! here: the CLI owns it, the tests draw on ratatui's test backend).

use std::{path::Path, time::Duration};

use ratatui::{
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, Paragraph, Row, Table},
    Frame,
};

use super::rates::{compact, Baseline, Rates, RuleRates, Traffic};
use crate::{
    config::{Percent, Unit},
    observe::stats::mode_text,
};

/// What the table shows; `t` switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Per second over the last interval.
    Rates,
    /// The counters' totals, since the maps were created (what `limiter stats` shows).
    Totals,
}

impl Mode {
    pub fn toggled(self) -> Mode {
        match self {
            Mode::Rates => Mode::Totals,
            Mode::Totals => Mode::Rates,
        }
    }
}

/// Everything one frame shows.
pub struct Screen<'a> {
    pub pin_dir: &'a Path,
    /// `--interval`: when the next reading comes.
    pub interval: Duration,
    pub mode: Mode,
    pub rates: &'a Rates,
    /// When the reading shown was taken, as the title shows it (e.g. `14:02:33 UTC`).
    pub taken: &'a str,
    /// Why the latest reading failed (the pins are gone: `detach`), shown above the
    /// last good one.
    pub problem: Option<&'a str>,
}

/// The keys, as the bottom line shows them.
pub const KEYS: &str = "t rates/totals · q, Esc or Ctrl-C quit";

const RATE_HEADERS: [&str; 6] = [
    "PASS/s",
    "DROP/s",
    "WOULD/s",
    "PASS B/s",
    "DROP B/s",
    "WOULD B/s",
];
const TOTAL_HEADERS: [&str; 6] = [
    "PASSED",
    "DROPPED",
    "WOULD",
    "PASSED B",
    "DROPPED B",
    "WOULD B",
];
/// Global counters per line of the bottom block.
const GLOBALS_PER_LINE: usize = 3;

fn unit_suffix(unit: Option<Unit>) -> &'static str {
    match unit {
        Some(Unit::Bytes) => "B/s",
        Some(Unit::Syn) => "syn/s",
        Some(Unit::Packets) => "pkt/s",
        None => "/s",
    }
}

/// The rule's aggregate rate in force (its share in fleet mode), in its unit.
fn rate_in_force(rule: &RuleRates) -> String {
    match rule.stats.rate {
        Some(rate) => format!("{} {}", compact(rate as f64), unit_suffix(rule.unit)),
        None => "-".to_string(),
    }
}

fn figures(rule: &RuleRates, mode: Mode) -> [String; 6] {
    let shown: Option<Traffic<f64>> = match mode {
        Mode::Rates => rule.per_second,
        Mode::Totals => {
            let t = Traffic::of(&rule.stats);
            Some(Traffic {
                passed_packets: t.passed_packets as f64,
                passed_bytes: t.passed_bytes as f64,
                dropped_packets: t.dropped_packets as f64,
                dropped_bytes: t.dropped_bytes as f64,
                would_drop_packets: t.would_drop_packets as f64,
                would_drop_bytes: t.would_drop_bytes as f64,
            })
        }
    };
    match shown {
        Some(t) => [
            t.passed_packets,
            t.dropped_packets,
            t.would_drop_packets,
            t.passed_bytes,
            t.dropped_bytes,
            t.would_drop_bytes,
        ]
        .map(compact),
        None => std::array::from_fn(|_| "…".to_string()),
    }
}

/// The rule's name with its mark: `+` added since the last reading, `*` counters
/// restarted (both measured from zero).
fn marked_name(rule: &RuleRates, mode: Mode) -> String {
    match (mode, rule.baseline) {
        (Mode::Rates, Baseline::Appeared) => format!("{}+", rule.stats.name),
        (Mode::Rates, Baseline::Restarted) => format!("{}*", rule.stats.name),
        _ => rule.stats.name.clone(),
    }
}

fn title(screen: &Screen) -> String {
    let what = match (screen.mode, screen.rates.elapsed) {
        (Mode::Rates, Some(elapsed)) => {
            format!("per second over the last {:.2} s", elapsed.as_secs_f64())
        }
        (Mode::Rates, None) => format!(
            "per second: first reading, rates in {:.1} s",
            screen.interval.as_secs_f64()
        ),
        (Mode::Totals, _) => "totals since the maps were created".to_string(),
    };
    format!(
        "limiter top · {} · {} · {what}",
        screen.pin_dir.display(),
        screen.taken
    )
}

fn status(screen: &Screen) -> Line<'static> {
    if let Some(problem) = screen.problem {
        return Line::styled(
            format!("reading failed (showing the last good reading): {problem}"),
            Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        );
    }
    if screen.rates.bypass {
        return Line::styled(
            "BYPASS ON: every frame passes unclassified, unmetered and uncounted; these counters \
             stand still",
            Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        );
    }
    Line::from("bypass: off")
}

fn rule_table<'a>(screen: &Screen) -> Table<'a> {
    let headers = match screen.mode {
        Mode::Rates => RATE_HEADERS,
        Mode::Totals => TOTAL_HEADERS,
    };
    let right = |s: String| Cell::from(Line::from(s).right_aligned());
    let header = Row::new(
        ["RULE", "MODE", "STATE", "RATE IN FORCE"]
            .into_iter()
            .map(|h| Cell::from(h.to_string()))
            .chain(headers.into_iter().map(|h| right(h.to_string()))),
    )
    .style(Style::new().add_modifier(Modifier::BOLD));
    let rows = screen.rates.rules.iter().map(|rule| {
        Row::new(
            [
                Cell::from(marked_name(rule, screen.mode)),
                Cell::from(mode_text(&rule.stats)),
                Cell::from(rule.stats.state.as_str()),
                right(rate_in_force(rule)),
            ]
            .into_iter()
            .chain(figures(rule, screen.mode).map(right)),
        )
    });
    let name_width = screen
        .rates
        .rules
        .iter()
        .map(|r| r.stats.name.chars().count() + 1)
        .max()
        .unwrap_or(0)
        .clamp(4, 32) as u16;
    // `enforce`, or a canary's `canary 0.125%`.
    let mode_width = screen
        .rates
        .rules
        .iter()
        .map(|r| mode_text(&r.stats).chars().count())
        .max()
        .unwrap_or(0)
        .max(7) as u16;
    let widths = [
        Constraint::Length(name_width),
        Constraint::Length(mode_width),
        Constraint::Length(10),
        Constraint::Length(13),
    ]
    .into_iter()
    .chain([Constraint::Length(9); 6]);
    Table::new(rows, widths).header(header)
}

/// A canary's refusals split in two: what it dropped for the sources it enforces for,
/// and what it let pass as would-drops for the others (the shadowed part). `None`: not a
/// canary.
fn canary_split(rule: &RuleRates, mode: Mode) -> Option<String> {
    if !rule.stats.is_canary() {
        return None;
    }
    let [_, dropped, would, ..] = figures(rule, mode);
    let per = match mode {
        Mode::Rates => "/s",
        Mode::Totals => "",
    };
    let enforced = rule.stats.enforce_percent;
    let others = Percent(Percent::ALL.0.saturating_sub(enforced.0));
    Some(format!(
        "canary {}: dropped {dropped}{per} (its {enforced}% of sources), would-drop \
         {would}{per} (the other {others}%, passed)",
        rule.stats.name
    ))
}

fn notes(screen: &Screen) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    if screen.rates.rules.is_empty() {
        out.push(Line::from("no rules installed"));
    }
    out.extend(
        screen
            .rates
            .rules
            .iter()
            .filter_map(|r| canary_split(r, screen.mode))
            .map(Line::from),
    );
    if screen.mode == Mode::Rates {
        let rules = &screen.rates.rules;
        if rules.iter().any(|r| r.baseline == Baseline::Appeared) {
            out.push(Line::from(
                "+ added since the last reading: measured from zero",
            ));
        }
        if rules.iter().any(|r| r.baseline == Baseline::Restarted) {
            out.push(Line::from(
                "* counters went backwards (maps recreated by detach + run, or the rule \
                 re-added): measured from zero, a lower bound",
            ));
        }
    }
    if !screen.rates.gone.is_empty() {
        out.push(Line::from(format!(
            "gone since the last reading: {}",
            screen.rates.gone.join(", ")
        )));
    }
    out
}

fn globals(screen: &Screen) -> Vec<Line<'static>> {
    let cells: Vec<String> = screen
        .rates
        .global
        .iter()
        .map(|g| {
            let figure = match screen.mode {
                Mode::Rates => match g.per_second {
                    Some(r) if r.restarted => format!("{}/s*", compact(r.per_second)),
                    Some(r) => format!("{}/s", compact(r.per_second)),
                    None => "…/s".to_string(),
                },
                Mode::Totals => compact(g.total as f64),
            };
            format!("{:<22}{figure:>9}", g.name)
        })
        .collect();
    let mut lines: Vec<Line<'static>> = cells
        .chunks(GLOBALS_PER_LINE)
        .map(|chunk| Line::from(chunk.join("   ")))
        .collect();
    lines.push(Line::from(format!(
        "sketch cells busy {:.2}%",
        screen.rates.sketch_busy_ppm as f64 / 1e4
    )));
    lines
}

/// Draws one frame.
pub fn draw(frame: &mut Frame, screen: &Screen) {
    let notes = notes(screen);
    let globals = globals(screen);
    let rules_height = screen.rates.rules.len() as u16 + 1;
    let [title_area, status_area, table_area, notes_area, globals_area, keys_area] =
        Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(rules_height.min(3)),
            Constraint::Length(notes.len() as u16),
            Constraint::Length(globals.len() as u16 + 1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
    frame.render_widget(
        Paragraph::new(Line::styled(
            title(screen),
            Style::new().add_modifier(Modifier::BOLD),
        )),
        title_area,
    );
    frame.render_widget(Paragraph::new(status(screen)), status_area);
    frame.render_widget(rule_table(screen), table_area);
    frame.render_widget(Paragraph::new(notes), notes_area);
    let mut global_lines = vec![Line::styled(
        match screen.mode {
            Mode::Rates => "global counters, per second",
            Mode::Totals => "global counters, totals",
        },
        Style::new().add_modifier(Modifier::BOLD),
    )];
    global_lines.extend(globals);
    frame.render_widget(Paragraph::new(global_lines), globals_area);
    frame.render_widget(Paragraph::new(Line::from(KEYS)), keys_area);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::collections::BTreeMap;

    use limiter_common::abi::{GlobalCounters, HeaderCounters, RuleCounters};
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::observe::{
        stats::{GlobalStats, RuleStats, StatsReport},
        top::rates::{rates, Sample},
    };

    fn rule(name: &str, unit_bytes: bool, passed: u64, dropped: u64, would: u64) -> RuleStats {
        RuleStats {
            name: name.to_string(),
            mode: if would > 0 {
                crate::config::Mode::Shadow
            } else {
                crate::config::Mode::Enforce
            },
            enforce_percent: crate::config::Percent(if would > 0 { 0 } else { 100_000 }),
            state: limiter_common::share::ShareState::Leased,
            rate: Some(if unit_bytes { 125_000_000 } else { 1_000 }),
            burst: Some(100),
            counters: RuleCounters {
                passed_packets: passed,
                passed_bytes: passed * 1_200,
                dropped_packets: dropped,
                dropped_bytes: dropped * 1_200,
                would_drop_packets: would,
                would_drop_bytes: would * 1_200,
                refused_early_packets: 0,
                refused_early_bytes: 0,
            },
            sources_saturated: None,
            sources_aside: false,
            sources_false_limit_ppm: None,
            reasons: Default::default(),
        }
    }

    /// A canary enforcing for `thousandths` of a percent of its sources.
    fn canary(name: &str, thousandths: u32, passed: u64, dropped: u64, would: u64) -> RuleStats {
        let mut r = rule(name, false, passed, dropped, 0);
        r.enforce_percent = crate::config::Percent(thousandths);
        r.counters.would_drop_packets = would;
        r.counters.would_drop_bytes = would * 1_200;
        r
    }

    fn global(unmatched: u64) -> GlobalStats {
        GlobalStats {
            counters: GlobalCounters {
                unmatched,
                ..GlobalCounters::default()
            },
            headers: HeaderCounters::default(),
            tunnels: Default::default(),
            handoff_missing: 0,
            new_sources: 0,
            source_refusals: 0,
            sketch_busy_ppm: 1234,
            no_rule_reasons: Default::default(),
            monitor: Default::default(),
        }
    }

    fn sample(at_s: u64, rules: Vec<RuleStats>, unmatched: u64) -> Sample {
        let units: BTreeMap<String, Unit> = rules
            .iter()
            .map(|r| {
                let unit = if r.rate == Some(125_000_000) {
                    Unit::Bytes
                } else {
                    Unit::Packets
                };
                (r.name.clone(), unit)
            })
            .collect();
        Sample {
            at: Duration::from_secs(at_s),
            report: StatsReport {
                rules,
                global: global(unmatched),
                bypass: false,
            },
            units,
        }
    }

    /// Draws `screen` on a 120×30 test backend and returns its lines.
    fn draw_lines(rates: &Rates, mode: Mode, problem: Option<&str>) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(120, 30)).unwrap();
        let screen = Screen {
            pin_dir: Path::new("/sys/fs/bpf/limiter"),
            interval: Duration::from_secs(1),
            mode,
            rates,
            taken: "14:02:33 UTC",
            problem,
        };
        terminal.draw(|f| draw(f, &screen)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    fn row<'a>(lines: &'a [String], name: &str) -> Vec<&'a str> {
        lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name} in\n{}", lines.join("\n")))
            .split_whitespace()
            .collect()
    }

    fn two_readings() -> (Sample, Sample) {
        let before = sample(
            100,
            vec![
                rule("contoso-web", false, 10_000, 4_000, 0),
                rule("contoso-net", true, 500, 0, 20),
            ],
            70,
        );
        let after = sample(
            102,
            vec![
                rule("contoso-web", false, 12_000, 10_000, 0),
                rule("contoso-net", true, 900, 0, 60),
            ],
            90,
        );
        (before, after)
    }

    /// The rates computed from two readings, as the screen shows them in each column.
    #[test]
    fn the_rates_screen_shows_each_rule_and_its_rates() {
        let (before, after) = two_readings();
        let rates = rates(Some(&before), &after);
        let lines = draw_lines(&rates, Mode::Rates, None);
        let secs = 2.0;
        let web = row(&lines, "contoso-web");
        // name, mode, state, rate in force (figure and unit), then the six figures.
        assert_eq!(
            web[..5],
            ["contoso-web", "enforce", "leased", "1000", "pkt/s"]
        );
        let want = [
            (12_000.0 - 10_000.0) / secs,
            (10_000.0 - 4_000.0) / secs,
            0.0,
            (12_000.0 - 10_000.0) * 1_200.0 / secs,
            (10_000.0 - 4_000.0) * 1_200.0 / secs,
            0.0,
        ]
        .map(compact);
        assert_eq!(web[5..], want);
        let net = row(&lines, "contoso-net");
        assert_eq!(net[..5], ["contoso-net", "shadow", "leased", "125M", "B/s"]);
        assert_eq!(net[7], compact((60.0 - 20.0) / secs), "would-drop/s");
        assert_eq!(net[10], compact((60.0 - 20.0) * 1_200.0 / secs));
        let text = lines.join("\n");
        assert!(text.contains("per second over the last 2.00 s"), "{text}");
        assert!(text.contains("14:02:33 UTC"), "{text}");
        assert!(
            text.contains("PASS/s") && text.contains("DROP B/s"),
            "{text}"
        );
        let unmatched = format!("unmatched {}/s", compact((90.0 - 70.0) / secs));
        assert!(
            text.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .contains(&unmatched),
            "{unmatched} in\n{text}"
        );
        assert!(text.contains("sketch cells busy 0.12%"), "{text}");
        assert!(text.contains(KEYS), "{text}");
    }

    #[test]
    fn the_totals_screen_shows_the_counters_as_limiter_stats_does() {
        let (before, after) = two_readings();
        let rates = rates(Some(&before), &after);
        let lines = draw_lines(&rates, Mode::Totals, None);
        let web = row(&lines, "contoso-web");
        let totals = &after.report.rules[0];
        assert_eq!(web[5], compact(totals.counters.passed_packets as f64));
        assert_eq!(web[6], compact(totals.counters.dropped_packets as f64));
        assert_eq!(web[9], compact(totals.counters.dropped_bytes as f64));
        let text = lines.join("\n");
        assert!(
            text.contains("totals since the maps were created"),
            "{text}"
        );
        assert!(
            text.contains("DROPPED") && !text.contains("DROP/s"),
            "{text}"
        );
    }

    /// The first reading has no rates yet; a rule added, one removed and counters that
    /// restarted are each marked; a failed reading is said on top.
    #[test]
    fn first_reading_marks_and_problems_are_shown() {
        let (before, _) = two_readings();
        let lines = draw_lines(&rates(None, &before), Mode::Rates, None);
        let web = row(&lines, "contoso-web");
        assert!(web[5..].iter().all(|f| *f == "…"), "{web:?}");
        assert!(lines.join("\n").contains("first reading, rates in 1.0 s"));

        let after = sample(
            103,
            vec![
                rule("contoso-web", false, 5, 0, 0),
                rule("contoso-api", false, 30, 0, 0),
            ],
            0,
        );
        let lines = draw_lines(
            &rates(Some(&before), &after),
            Mode::Rates,
            Some("no maps pinned at /sys/fs/bpf/limiter"),
        );
        let text = lines.join("\n");
        assert!(text.contains("contoso-web*"), "{text}");
        assert!(text.contains("contoso-api+"), "{text}");
        assert!(
            text.contains("gone since the last reading: contoso-net"),
            "{text}"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("contoso-net")),
            "{text}"
        );
        assert!(text.contains("reading failed"), "{text}");
        assert!(text.contains("no maps pinned"), "{text}");
    }

    /// A canary's MODE cell says its percentage (the column widens for it), and a line
    /// below splits its refusals: dropped for the sources it enforces for, would-drop
    /// (passed) for the others, as rates and as totals.
    #[test]
    fn a_canary_shows_its_percentage_and_splits_its_drops() {
        let before = sample(
            100,
            vec![
                rule("contoso-web", false, 10_000, 4_000, 0),
                canary("contoso-api", 5_000, 1_000, 300, 5_700),
                canary("contoso-dns", 125, 0, 0, 0),
            ],
            0,
        );
        let after = sample(
            102,
            vec![
                rule("contoso-web", false, 12_000, 10_000, 0),
                canary("contoso-api", 5_000, 1_400, 700, 13_300),
                canary("contoso-dns", 125, 0, 0, 0),
            ],
            0,
        );
        let rates = rates(Some(&before), &after);

        let lines = draw_lines(&rates, Mode::Rates, None);
        let text = lines.join("\n");
        let api = row(&lines, "contoso-api");
        assert_eq!(
            api[..4],
            ["contoso-api", "canary", "5%", "leased"],
            "{text}"
        );
        let dns = row(&lines, "contoso-dns");
        assert_eq!(
            dns[..4],
            ["contoso-dns", "canary", "0.125%", "leased"],
            "{text}"
        );
        assert_eq!(row(&lines, "contoso-web")[1], "enforce");
        let (dropped, would) = (
            compact((700.0 - 300.0) / 2.0),
            compact((13_300.0 - 5_700.0) / 2.0),
        );
        assert_eq!(
            api[7..9],
            [dropped.as_str(), would.as_str()],
            "DROP/s, WOULD/s"
        );
        let split = format!(
            "canary contoso-api: dropped {dropped}/s (its 5% of sources), would-drop {would}/s \
             (the other 95%, passed)"
        );
        assert!(lines.contains(&split), "{split} in\n{text}");
        assert!(
            text.contains(
                "canary contoso-dns: dropped 0/s (its 0.125% of sources), would-drop \
                 0/s (the other 99.875%, passed)"
            ),
            "{text}"
        );
        assert!(
            !text.contains("canary contoso-web"),
            "not a canary:\n{text}"
        );

        let lines = draw_lines(&rates, Mode::Totals, None);
        let text = lines.join("\n");
        let api = row(&lines, "contoso-api");
        let (dropped, would) = (compact(700.0), compact(13_300.0));
        assert_eq!(
            api[7..9],
            [dropped.as_str(), would.as_str()],
            "DROPPED, WOULD"
        );
        let split = format!(
            "canary contoso-api: dropped {dropped} (its 5% of sources), would-drop {would} \
             (the other 95%, passed)"
        );
        assert!(lines.contains(&split), "{split} in\n{text}");
    }
}
