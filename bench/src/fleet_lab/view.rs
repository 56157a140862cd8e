//! The fleet lab's terminal view (ratatui on crossterm): per host its share, state,
//! lease age and rates; the fleet's admitted rate against the quota over the last
//! minute; each allocator replica's role and term; the events; the keys.

use std::{collections::VecDeque, time::Duration};

use anyhow::{Context as _, Result};
use ratatui::{
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    symbols,
    text::{Line, Span},
    widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Row, Table},
    DefaultTerminal, Frame,
};

use super::{Action, History, HostSecond, LabConfig, ReplicaReading};

/// Everything one frame of the view shows.
pub struct Screen<'a> {
    pub config: &'a LabConfig,
    pub t: Duration,
    pub hosts: &'a [HostSecond],
    pub replicas: &'a [ReplicaReading],
    pub admitted: f64,
    pub history: &'a History,
    pub events: &'a VecDeque<String>,
}

/// The terminal in raw mode on the alternate screen; restored on drop (and by the panic
/// hook ratatui installs, before the panic message prints).
pub struct Terminal(DefaultTerminal);

impl Terminal {
    pub fn new() -> Result<Terminal> {
        Ok(Terminal(
            ratatui::try_init().context("setting up the terminal")?,
        ))
    }

    pub fn draw(&mut self, screen: &Screen<'_>) -> Result<()> {
        self.0
            .draw(|frame| draw(frame, screen))
            .context("drawing the view")?;
        Ok(())
    }

    /// The action of the next key pressed within `timeout`, if any (Ctrl-C quits: raw
    /// mode turns it into a key, not a signal).
    pub fn key(&mut self, timeout: Duration, hosts: usize) -> Result<Option<Action>> {
        if !event::poll(timeout).context("reading the terminal")? {
            return Ok(None);
        }
        let Event::Key(key) = event::read().context("reading the terminal")? else {
            return Ok(None);
        };
        if key.kind != KeyEventKind::Press {
            return Ok(None);
        }
        Ok(match key.code {
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                Some(Action::Quit)
            }
            KeyCode::Esc => Some(Action::Quit),
            KeyCode::Char(c) => Action::of_key(c, hosts),
            _ => None,
        })
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn state_style(state: &str) -> Style {
    match state {
        "leased" => Style::new().fg(Color::Green),
        "sticky" => Style::new().fg(Color::Yellow),
        "fail_open" => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        _ => Style::new().fg(Color::Cyan),
    }
}

fn role_style(role: &str) -> Style {
    match role {
        "leader" => Style::new().fg(Color::Green).add_modifier(Modifier::BOLD),
        "follower" => Style::new().fg(Color::Cyan),
        _ => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

fn draw(frame: &mut Frame<'_>, s: &Screen<'_>) {
    let c = s.config;
    let [title, allocators, table, global, chart, events, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(s.replicas.len() as u16 + 3),
        Constraint::Length(s.hosts.len() as u16 + 3),
        Constraint::Length(1),
        Constraint::Min(8),
        Constraint::Length(7),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    frame.render_widget(
        Paragraph::new(format!(
            "limiter fleet lab — {:.0} s — rule \"{}\": quota {}/s, {} hosts offering {}/s \
             — {} replicas on etcd — lease {} ms, reports {} ms, sticky {} s",
            s.t.as_secs_f64(),
            super::fleet::RULE,
            c.quota,
            c.hosts,
            c.offered_per_host,
            c.replicas,
            c.lease_ttl_ms,
            c.report_interval_ms,
            c.sticky_max_s
        ))
        .style(Style::new().add_modifier(Modifier::BOLD)),
        title,
    );

    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let replica_rows = s.replicas.iter().map(|r| {
        let role = r.role();
        Row::new(vec![
            Span::raw(r.name.clone()),
            Span::styled(role.to_uppercase(), role_style(role)),
            // The gauge is 0 on a follower: only the leader has a term to show.
            Span::raw(if r.leader {
                r.term.to_string()
            } else {
                "-".into()
            }),
            match r.etcd_reachable {
                Some(true) => Span::raw("ok"),
                Some(false) => Span::styled("UNREACHABLE", Style::new().fg(Color::Red)),
                None => Span::raw("-"),
            },
            Span::raw(opt(r.pid.map(u64::from))),
            Span::raw(if r.leader { opt(r.granted) } else { "-".into() }),
            Span::raw(if r.leader { opt(r.hosts) } else { "-".into() }),
        ])
    });
    let up = s.replicas.iter().filter(|r| r.up).count();
    let replicas_title = match super::leader(s.replicas) {
        Some(l) => format!(
            " allocator replicas, elected in etcd: {} leads (term {}), {up} of {} up ",
            l.name,
            l.term,
            s.replicas.len()
        ),
        None if up > 0 => format!(
            " allocator replicas, elected in etcd: none leads yet ({up} of {} up; hosts \
             keep their shares meanwhile) ",
            s.replicas.len()
        ),
        None => " allocator replicas: all DOWN — hosts keep their last share (STICKY) once \
                 their lease lapses, then fail open "
            .to_string(),
    };
    frame.render_widget(
        Table::new(
            replica_rows,
            [
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Length(6),
                Constraint::Length(12),
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Length(6),
            ],
        )
        .header(
            Row::new([
                "replica",
                "role",
                "term",
                "etcd",
                "pid",
                "granted/s",
                "hosts",
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(Block::bordered().title(replicas_title)),
        allocators,
    );

    let header = Row::new([
        "host",
        "state",
        "share/s",
        "lease age",
        "passed/s",
        "dropped/s",
        "link",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    let rows = s.hosts.iter().map(|h| {
        Row::new(vec![
            Span::raw(h.name.clone()),
            Span::styled(h.reading.state.to_uppercase(), state_style(h.reading.state)),
            Span::raw(if h.reading.state == "fail_open" {
                "none".to_string()
            } else {
                h.reading.share.to_string()
            }),
            Span::raw(
                h.reading
                    .lease_age
                    .map_or("-".to_string(), |a| format!("{:.1} s", a.as_secs_f64())),
            ),
            Span::raw(format!("{:.0}", h.passed_per_s)),
            Span::raw(format!("{:.0}", h.dropped_per_s)),
            if h.partitioned {
                Span::styled("PARTITIONED", Style::new().fg(Color::Red))
            } else {
                Span::raw("ok")
            },
        ])
    });
    frame.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(6),
                Constraint::Length(11),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(12),
            ],
        )
        .header(header)
        .block(Block::bordered().title(" hosts (from each daemon's pinned maps) ")),
        table,
    );

    let ratio = s.admitted / c.quota.max(1) as f64;
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::raw("fleet admits "),
            Span::styled(
                format!("{:.0}/s", s.admitted),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                " of a {}/s quota ({:.0} %); offered {}/s",
                c.quota,
                100.0 * ratio,
                c.offered_per_host * c.hosts as u64
            )),
        ])),
        global,
    );

    let points = s.history.points();
    let now = s.t.as_secs_f64();
    let x0 = (now - History::SPAN.as_secs_f64()).max(0.0);
    // Twice the quota, so the quota is the middle label, unless more was admitted.
    let top = (c.quota as f64 * 2.0).max(s.history.max() * 1.1).max(1.0);
    let quota_line = [(x0, c.quota as f64), (now.max(x0 + 1.0), c.quota as f64)];
    let datasets = vec![
        Dataset::default()
            .name("quota")
            .marker(symbols::Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::new().fg(Color::DarkGray))
            .data(&quota_line),
        Dataset::default()
            .name("admitted/s")
            .marker(symbols::Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::new().fg(Color::Cyan))
            .data(&points),
    ];
    frame.render_widget(
        Chart::new(datasets)
            .block(Block::bordered().title(" fleet-wide admitted rate, last minute "))
            .x_axis(
                Axis::default()
                    .bounds([x0, now.max(x0 + 1.0)])
                    .labels([format!("{x0:.0} s"), format!("{now:.0} s")]),
            )
            .y_axis(Axis::default().bounds([0.0, top]).labels([
                "0".to_string(),
                format!("{:.0}", top / 2.0),
                format!("{top:.0}"),
            ])),
        chart,
    );

    let lines: Vec<Line<'_>> = s.events.iter().map(|e| Line::raw(e.as_str())).collect();
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(
            " events — leader killed: the next leads within ~{} ms, hosts stay LEASED; all \
             down: STICKY within {} ms, FAIL_OPEN {} s later ",
            c.election_ttl_ms, c.lease_ttl_ms, c.sticky_max_s
        ))),
        events,
    );
    frame.render_widget(
        Paragraph::new(format!(
            "k kill the leader replica (SIGKILL) · r restart the killed replicas · 1–{} \
             partition/heal that host (from every replica) · q or Ctrl-C quit",
            c.hosts
        ))
        .style(Style::new().fg(Color::Black).bg(Color::Gray)),
        help,
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::fleet_lab::HostReading;

    fn host(name: &str, state: &'static str, partitioned: bool) -> HostSecond {
        HostSecond {
            name: name.into(),
            reading: HostReading {
                state,
                share: 1000,
                lease_age: Some(Duration::from_millis(1500)),
                passed: 0,
                dropped: 0,
            },
            passed_per_s: 1000.0,
            dropped_per_s: 987.0,
            partitioned,
        }
    }

    /// The screen as text, one string per row.
    fn render(replicas: &[ReplicaReading], hosts: &[HostSecond]) -> Vec<String> {
        let config = LabConfig::default();
        let mut history = History::default();
        for s in 0..70 {
            history.push(Duration::from_secs(s), 2990.0);
        }
        let events: VecDeque<String> = ["t=8.0 lb-1: leased → sticky".to_string()].into();
        let screen = Screen {
            config: &config,
            t: Duration::from_secs(70),
            hosts,
            replicas,
            admitted: 2990.0,
            history: &history,
            events: &events,
        };
        let mut terminal = Terminal::new(TestBackend::new(150, 40)).unwrap();
        terminal.draw(|f| draw(f, &screen)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol().to_string())
                    .collect()
            })
            .collect()
    }

    fn replica(name: &str, leader: bool, pid: u32) -> ReplicaReading {
        ReplicaReading {
            name: name.into(),
            pid: Some(pid),
            up: true,
            leader,
            term: if leader { 17 } else { 0 },
            etcd_reachable: Some(true),
            granted: Some(3000),
            hosts: Some(3),
        }
    }

    #[test]
    fn the_view_shows_every_host_the_fleet_the_replicas_and_the_keys() {
        let replicas = [
            ReplicaReading::down("alloc-1", None),
            replica("alloc-2", true, 4242),
            replica("alloc-3", false, 4343),
        ];
        let hosts = [
            host("lb-1", "leased", false),
            host("lb-2", "sticky", true),
            host("lb-3", "fail_open", false),
        ];
        let rows = render(&replicas, &hosts);
        let text = rows.join("\n");
        let row = |needle: &str| {
            rows.iter()
                .find(|r| r.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} on\n{text}"))
        };
        let lb1 = row("lb-1 ");
        assert!(
            lb1.contains("LEASED") && lb1.contains("1000") && lb1.contains("1.5 s"),
            "{lb1}"
        );
        assert!(lb1.contains("987"), "dropped/s: {lb1}");
        assert!(row("lb-2 ").contains("STICKY") && row("lb-2 ").contains("PARTITIONED"));
        assert!(row("lb-3 ").contains("FAIL_OPEN") && row("lb-3 ").contains("none"));
        assert!(row("│alloc-1 ").contains("DOWN"), "{}", row("│alloc-1 "));
        let leader = row("│alloc-2 ");
        assert!(
            leader.contains("LEADER") && leader.contains(" 17 ") && leader.contains("4242"),
            "{leader}"
        );
        assert!(leader.contains("3000") && leader.contains("ok"), "{leader}");
        let follower = row("│alloc-3 ");
        assert!(
            follower.contains("FOLLOWER")
                && follower.contains("4343")
                && !follower.contains("3000"),
            "{follower}"
        );
        assert!(row("allocator replicas").contains("alloc-2 leads (term 17), 2 of 3 up"));
        assert!(row("fleet admits").contains("2990/s of a 3000/s quota (100 %)"));
        assert!(text.contains("last minute"), "the chart:\n{text}");
        assert!(row("events").contains("FAIL_OPEN") && text.contains("lb-1: leased → sticky"));
        // The middle label of the chart is the quota, where the quota's line runs.
        assert!(text.contains("│3000│"), "{text}");
        let help = rows.last().unwrap();
        assert!(
            help.contains("k kill the leader")
                && help.contains("r restart")
                && help.contains("q or Ctrl-C"),
            "{help}"
        );

        let down = [
            ReplicaReading::down("alloc-1", None),
            ReplicaReading::down("alloc-2", None),
            ReplicaReading::down("alloc-3", None),
        ];
        let rows = render(&down, &hosts);
        assert!(
            rows.iter()
                .any(|r| r.contains("allocator replicas: all DOWN")),
            "{}",
            rows.join("\n")
        );
        let electing = [
            ReplicaReading::down("alloc-1", None),
            replica("alloc-2", false, 1),
        ];
        let rows = render(&electing, &hosts);
        assert!(
            rows.iter().any(|r| r.contains("none leads yet (1 of 2 up")),
            "{}",
            rows.join("\n")
        );
        eprintln!("{text}");
    }
}
