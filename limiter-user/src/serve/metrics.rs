//! Prometheus text exposition: a pure renderer over a snapshot, served on the configured
//! address by limiter_service::metrics (`GET`/`HEAD /metrics`).
//!
//! A scrape must cost the daemon's other work nothing: with 1,024 rules a snapshot reads
//! thousands of kernel counters (a syscall each). So the daemon's lock is held only to
//! copy what it alone knows (the installed rules, quotas, fleet counters); the counters
//! are read after it is released, through the metrics' own handles on the pinned maps,
//! on tokio's blocking pool; and the text is made at most once per [`MAX_AGE`] for any
//! number of scrapers.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use limiter_common::{abi::RuleConfig, drop::DropReason, share::ShareState};
use tokio::sync::broadcast;

use crate::{
    bpf::maps::Maps,
    config::Unit,
    daemon::{Daemon, FleetCounters, InterfaceState, QuotaEntry, RuleSaturation},
    host::object::Variant,
    observe::stats::{ReasonCount, StatsReport},
    serve::shutdown::Shutdown,
};

/// Everything one scrape shows.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub stats: StatsReport,
    pub quotas: Vec<QuotaEntry>,
    /// Cells per row of the per-source sketch (`max_sources` rounded up).
    pub sketch_width: u32,
    /// (run time, run count) of the XDP program when kernel.bpf_stats_enabled = 1.
    pub program_runs: Option<(Duration, u64)>,
    /// Fleet counters since the daemon started (fleet mode).
    pub fleet: Option<FleetCounters>,
    /// The per-source rules' saturation gates (their transitions since the daemon started).
    pub saturation: Vec<RuleSaturation>,
    /// Each configured interface: whether the program runs on it now.
    pub interfaces: Vec<InterfaceState>,
    /// `join_program_array`: whether the joined slot held the limiter at the last check.
    pub joined_slot_holds_limiter: Option<bool>,
}

/// Label values escape backslash, quote and newline.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// How metric names say a rule's unit: the name's suffix and the HELP's words. A match,
/// so a new unit cannot be left without its own series.
const fn unit_names(unit: Unit) -> (&'static str, &'static str) {
    match unit {
        Unit::Packets => ("packets", "packets"),
        Unit::Bytes => ("bytes", "bytes"),
        Unit::Syn => ("syn_packets", "TCP SYN packets"),
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A rule's dropped and would-drop packets by reason. Every rule has its `aggregate`
/// series (0 until it refuses), and a series for each other reason that has refused;
/// packets counted before the program counted reasons (maps pinned by an earlier
/// version) are `unattributed`, so the series of a rule always add up to its packets.
fn render_reasons(out: &mut String, s: &Snapshot) {
    type Field = fn(&ReasonCount) -> u64;
    type Total = fn(&crate::observe::stats::RuleStats) -> u64;
    let families: [(&str, &str, Field, Total); 2] = [
        (
            "limiter_rule_dropped_packets_total",
            "Frames the rule dropped (enforce mode), by reason.",
            |c| c.dropped_packets,
            |r| r.counters.dropped_packets,
        ),
        (
            "limiter_rule_would_drop_packets_total",
            "Frames a shadow-mode rule (or the rule outside its canary) would have dropped, \
             by reason.",
            |c| c.would_drop_packets,
            |r| r.counters.would_drop_packets,
        ),
    ];
    for (name, help, field, total) in families {
        family(out, name, "counter", help);
        for r in &s.stats.rules {
            let rule = label(&r.name);
            let mut counted = 0u64;
            let aggregate = DropReason::Aggregate.label();
            let _ = writeln!(
                out,
                "{name}{{rule=\"{rule}\",reason=\"{aggregate}\"}} {}",
                r.reasons.get(aggregate).map_or(0, field)
            );
            for (reason, count) in &r.reasons {
                counted = counted.wrapping_add(field(count));
                if *reason != aggregate && field(count) != 0 {
                    let _ = writeln!(
                        out,
                        "{name}{{rule=\"{rule}\",reason=\"{reason}\"}} {}",
                        field(count)
                    );
                }
            }
            let unattributed = total(r).saturating_sub(counted);
            if unattributed != 0 {
                let _ = writeln!(
                    out,
                    "{name}{{rule=\"{rule}\",reason=\"unattributed\"}} {unattributed}"
                );
            }
        }
    }
    family(
        out,
        "limiter_dropped_packets_total",
        "counter",
        "Frames dropped before any rule could see them, by reason.",
    );
    for reason in [DropReason::DeepVlan, DropReason::UnreadableTunnel] {
        let count = s
            .stats
            .global
            .no_rule_reasons
            .get(reason.label())
            .map_or(0, |c| c.dropped_packets);
        let _ = writeln!(
            out,
            "limiter_dropped_packets_total{{reason=\"{}\"}} {count}",
            reason.label()
        );
    }
    let m = &s.stats.global.monitor;
    family(
        out,
        "limiter_monitor_sampled_events_total",
        "counter",
        "Sampled drop events written for limiter monitor ([monitor]).",
    );
    let _ = writeln!(out, "limiter_monitor_sampled_events_total {}", m.sampled);
    family(
        out,
        "limiter_monitor_lost_events_total",
        "counter",
        "Refusals not sampled: cause=\"budget\" (the CPU's events_per_sec spent), \
         cause=\"full\" (the ring buffer full: nothing reads it, or too slowly).",
    );
    let _ = writeln!(
        out,
        "limiter_monitor_lost_events_total{{cause=\"budget\"}} {}",
        m.skipped_budget
    );
    let _ = writeln!(
        out,
        "limiter_monitor_lost_events_total{{cause=\"full\"}} {}",
        m.lost_full
    );
}

/// Renders `s` in the Prometheus text format (version 0.0.4).
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    type Field = fn(&crate::observe::stats::RuleStats) -> u64;
    let counters: [(&str, &str, Field); 4] = [
        (
            "limiter_rule_passed_packets_total",
            "Frames the rule passed.",
            |r| r.counters.passed_packets,
        ),
        (
            "limiter_rule_passed_bytes_total",
            "Bytes of the frames the rule passed.",
            |r| r.counters.passed_bytes,
        ),
        (
            "limiter_rule_dropped_bytes_total",
            "Bytes of the frames the rule dropped.",
            |r| r.counters.dropped_bytes,
        ),
        (
            "limiter_rule_would_drop_bytes_total",
            "Bytes a shadow-mode rule would have dropped.",
            |r| r.counters.would_drop_bytes,
        ),
    ];
    for (name, help, field) in counters {
        family(&mut out, name, "counter", help);
        for r in &s.stats.rules {
            let _ = writeln!(out, "{name}{{rule=\"{}\"}} {}", label(&r.name), field(r));
        }
    }
    render_reasons(&mut out, s);
    // One series a unit: a rate in packets/s and one in bytes/s never share a name.
    for &unit in Unit::ALL {
        let (suffix, counts) = unit_names(unit);
        let name = format!("limiter_rule_rate_{suffix}_per_second");
        family(
            &mut out,
            &name,
            "gauge",
            &format!(
                "Aggregate rate in force of the rules counting {}, per second (after quota \
                 changes).",
                counts
            ),
        );
        for q in s.quotas.iter().filter(|q| q.unit == unit.as_str()) {
            if let Some(rate) = q.rate {
                let _ = writeln!(out, "{name}{{rule=\"{}\"}} {rate}", label(&q.rule));
            }
        }
        let name = format!("limiter_rule_burst_{suffix}");
        family(
            &mut out,
            &name,
            "gauge",
            &format!(
                "Aggregate burst in force of the rules counting {} (after quota changes).",
                counts
            ),
        );
        for q in s.quotas.iter().filter(|q| q.unit == unit.as_str()) {
            if let Some(burst) = q.burst {
                let _ = writeln!(out, "{name}{{rule=\"{}\"}} {burst}", label(&q.rule));
            }
        }
    }
    family(
        &mut out,
        "limiter_rule_share_state",
        "gauge",
        "Fleet share state of the rule: 1 for the current state.",
    );
    for r in &s.stats.rules {
        for state in ShareState::ALL {
            let _ = writeln!(
                out,
                "limiter_rule_share_state{{rule=\"{}\",state=\"{}\"}} {}",
                label(&r.name),
                state.as_str(),
                u8::from(r.state == state)
            );
        }
    }
    family(
        &mut out,
        "limiter_rule_enforce_ratio",
        "gauge",
        "Share of sources whose refusals the rule drops, 0 to 1: 1 in enforce mode, 0 in \
         shadow mode, a canary's enforce_percent / 100 (the others' refusals are would-drops).",
    );
    for r in &s.stats.rules {
        let _ = writeln!(
            out,
            "limiter_rule_enforce_ratio{{rule=\"{}\"}} {}",
            label(&r.name),
            r.enforce_percent.ratio()
        );
    }
    render_saturation(&mut out, s);
    family(
        &mut out,
        "limiter_bypass",
        "gauge",
        "1 while the CONTROL bypass bit is set: every frame passes unclassified, unmetered \
         and uncounted.",
    );
    let _ = writeln!(out, "limiter_bypass {}", u8::from(s.stats.bypass));
    if let Some(holds) = s.joined_slot_holds_limiter {
        family(
            &mut out,
            "limiter_joined_slot_holds_limiter",
            "gauge",
            "join_program_array: 1 while the joined slot of the LB's root array holds the \
             limiter, 0 while another program (or none) is there and frames skip the limiter.",
        );
        let _ = writeln!(out, "limiter_joined_slot_holds_limiter {}", u8::from(holds));
    }
    family(
        &mut out,
        "limiter_source_sketch_busy_ratio",
        "gauge",
        "Estimated share of the per-source sketch's cells holding state (a sample).",
    );
    let _ = writeln!(
        out,
        "limiter_source_sketch_busy_ratio {}",
        s.stats.global.sketch_busy_ppm as f64 / 1e6
    );
    family(
        &mut out,
        "limiter_source_sketch_width",
        "gauge",
        "Cells per row of the per-source sketch (max_sources rounded up to a power of two).",
    );
    let _ = writeln!(out, "limiter_source_sketch_width {}", s.sketch_width);
    let g = &s.stats.global;
    for (name, help, v) in [
        (
            "limiter_malformed_packets_total",
            "Frames the parser could not read (passed).",
            g.counters.malformed,
        ),
        ("limiter_non_ip_packets_total", "Frames that are not IP (passed).", g.counters.non_ip),
        (
            "limiter_unmatched_packets_total",
            "Frames of IP that no rule matched (passed).",
            g.counters.unmatched,
        ),
        (
            "limiter_source_insert_failed_packets_total",
            "Frames a per-source limit could not meter (the sketch not set up yet).",
            g.counters.sketch_unseeded,
        ),
        (
            "limiter_new_source_packets_total",
            "Frames from sources the per-source sketch held no state for (new sources).",
            g.new_sources,
        ),
        (
            "limiter_source_refused_packets_total",
            "Frames refused by a per-source limit.",
            g.source_refusals,
        ),
        (
            "limiter_contended_packets_total",
            "Frames passed unmetered after losing the bucket update race.",
            g.counters.contended,
        ),
        (
            "limiter_fragment_packets_total",
            "Frames that are IP fragments (first and later ones).",
            g.headers.fragments,
        ),
        (
            "limiter_tiny_fragment_packets_total",
            "Frames that are first fragments without the whole transport header or IPv6 header chain (refused).",
            g.headers.tiny_fragments,
        ),
        (
            "limiter_orphan_fragment_packets_total",
            "Frames that are later fragments without a passed first fragment, to a rule that depends on ports (refused).",
            g.headers.orphan_fragments,
        ),
        (
            "limiter_overlapping_fragment_packets_total",
            "Frames that are later fragments overlapping the first fragment's headers (refused).",
            g.headers.overlapping_fragments,
        ),
        (
            "limiter_long_header_chain_packets_total",
            "Frames whose IPv6 extension-header chain is longer than the program walks (refused where a rule covers the destination).",
            g.headers.long_header_chains,
        ),
        (
            "limiter_tunnel_decapsulated_packets_total",
            "Frames of a tunnel their interface decapsulates, classified by their inner header.",
            g.tunnels.decapsulated,
        ),
        (
            "limiter_handoff_missing_packets_total",
            "Frames the limiter passed whose next program (next_program, join_program_array) was missing: passed to the stack (fail open).",
            g.handoff_missing,
        ),
    ] {
        family(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    if let Some(fleet) = s.fleet {
        family(
            &mut out,
            "limiter_fleet_grants_refused_total",
            "counter",
            "Allocator grants refused because their share does not compile (rate above the \
             maximum, a burst too long to refill); the rule keeps its share.",
        );
        let _ = writeln!(
            out,
            "limiter_fleet_grants_refused_total {}",
            fleet.grants_refused
        );
        family(
            &mut out,
            "limiter_fleet_credited_packets_total",
            "counter",
            "Frames (packets, SYNs) admitted on the fleet's credit since the daemon started: \
             refused by a share's bucket, admitted on quota the fleet left unused.",
        );
        let _ = writeln!(
            out,
            "limiter_fleet_credited_packets_total {}",
            fleet.credited
        );
        family(
            &mut out,
            "limiter_fleet_report_failures_total",
            "counter",
            "Reports to the allocators that failed (none reachable, no leader, a deadline \
             passed) since the daemon started: shares go STICKY, then FAIL_OPEN, on their \
             deadlines.",
        );
        let _ = writeln!(
            out,
            "limiter_fleet_report_failures_total {}",
            fleet.report_failures
        );
        family(
            &mut out,
            "limiter_fleet_tls_reload_failures_total",
            "counter",
            "Changes of the fleet TLS files (ca, cert, key) that made no valid configuration \
             (a file mid-rotation, unparsable, a key not matching its certificate) since the \
             daemon started: new connections keep the last good one.",
        );
        let _ = writeln!(
            out,
            "limiter_fleet_tls_reload_failures_total {}",
            fleet.tls_reload_failures
        );
        family(
            &mut out,
            "limiter_fleet_size_disagreement",
            "gauge",
            "1 while the allocator's configuration names another fleet_size than this \
             host's (a joiner's share while the allocator learns is not what this host \
             enforces in BOOTSTRAP), 0 otherwise.",
        );
        let _ = writeln!(
            out,
            "limiter_fleet_size_disagreement {}",
            u8::from(fleet.fleet_size_disagreement.is_some())
        );
    }
    family(
        &mut out,
        "limiter_interface_attached",
        "gauge",
        "1 while the program runs on the configured interface; 0 while the interface is \
         gone, or was created again and the daemon has not attached to it yet.",
    );
    for i in &s.interfaces {
        let _ = writeln!(
            out,
            "limiter_interface_attached{{interface=\"{}\",hook=\"{}\"}} {}",
            label(&i.name),
            i.hook,
            u8::from(i.attached)
        );
    }
    family(
        &mut out,
        "limiter_interface_reattaches_total",
        "counter",
        "Times the daemon attached the program again to an interface created again under \
         its name (driver reset, ip link del/add) since it started.",
    );
    for i in &s.interfaces {
        let _ = writeln!(
            out,
            "limiter_interface_reattaches_total{{interface=\"{}\"}} {}",
            label(&i.name),
            i.reattaches
        );
    }
    if let Some((time, count)) = s.program_runs {
        family(
            &mut out,
            "limiter_program_run_seconds_total",
            "counter",
            "Time spent in the XDP program (kernel.bpf_stats_enabled).",
        );
        let _ = writeln!(
            out,
            "limiter_program_run_seconds_total {}",
            time.as_secs_f64()
        );
        family(
            &mut out,
            "limiter_program_runs_total",
            "counter",
            "Runs of the program, all builds (kernel.bpf_stats_enabled).",
        );
        let _ = writeln!(out, "limiter_program_runs_total {count}");
    }
    limiter_service::metrics::process_families(
        &mut out,
        "limiter_build_info",
        env!("CARGO_PKG_VERSION"),
    );
    out
}

/// The per-source rules' saturation: the state and estimate their entries and cells show
/// (as `stats`), and the daemon's count of transitions.
fn render_saturation(out: &mut String, s: &Snapshot) {
    let rules: Vec<_> = s
        .stats
        .rules
        .iter()
        .filter_map(|r| Some((r, r.sources_saturated?)))
        .collect();
    family(
        out,
        "limiter_rule_sources_saturated",
        "gauge",
        "1 while a flood saturates the rule's per-source cells (honest sources under their \
         limit would be refused; on_saturation says whether the limit stands aside).",
    );
    for (r, saturated) in &rules {
        let _ = writeln!(
            out,
            "limiter_rule_sources_saturated{{rule=\"{}\"}} {}",
            label(&r.name),
            u8::from(*saturated)
        );
    }
    family(
        out,
        "limiter_rule_sources_false_limit_ratio",
        "gauge",
        "Estimated share of fresh sources under their limit that the rule's per-source cells \
         refuse now (a sample of its cells).",
    );
    for (r, _) in &rules {
        let _ = writeln!(
            out,
            "limiter_rule_sources_false_limit_ratio{{rule=\"{}\"}} {}",
            label(&r.name),
            r.sources_false_limit_ppm.unwrap_or(0) as f64 / 1e6
        );
    }
    family(
        out,
        "limiter_rule_sources_saturation_transitions_total",
        "counter",
        "Times the rule's per-source cells became saturated or clear since the daemon started.",
    );
    for g in &s.saturation {
        let _ = writeln!(
            out,
            "limiter_rule_sources_saturation_transitions_total{{rule=\"{}\"}} {}",
            label(&g.rule),
            g.transitions
        );
    }
}

/// How old the text a scrape gets may be: scrapers ask every 15 s or so, a flood of
/// them gets one render a second.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// What only the daemon knows, copied under its lock (no map is read but a few program
/// infos).
struct Held {
    rules: BTreeMap<u32, RuleConfig>,
    quotas: Vec<QuotaEntry>,
    program_runs: Option<(Duration, u64)>,
    fleet: Option<FleetCounters>,
    interfaces: Vec<InterfaceState>,
    saturation: Vec<RuleSaturation>,
    joined: Option<bool>,
}

fn held(d: &Daemon) -> Held {
    // The builds share the maps; interfaces may run different ones.
    let mut program_runs = None;
    for variant in Variant::ALL {
        if let Ok(info) = d.program().info(variant) {
            let (time, count) = program_runs.unwrap_or((Duration::ZERO, 0));
            program_runs = Some((time + info.run_time(), count + info.run_count()));
        }
    }
    Held {
        rules: d.installed_rules(),
        quotas: d.quotas(),
        program_runs: program_runs.filter(|&(_, count)| count > 0),
        fleet: d.fleet_counters(),
        interfaces: d.interface_states(),
        saturation: d.saturation(),
        joined: d.joined_holds(),
    }
}

/// The snapshot from what the daemon held and the counters in `maps`.
fn complete(held: Held, maps: &Maps) -> Result<Snapshot, crate::Error> {
    Ok(Snapshot {
        stats: crate::observe::stats::collect_for(maps, &held.rules)?,
        quotas: held.quotas,
        sketch_width: maps.sketch_width(),
        program_runs: held.program_runs,
        fleet: held.fleet,
        interfaces: held.interfaces,
        saturation: held.saturation,
        joined_slot_holds_limiter: held.joined,
    })
}

/// Takes a snapshot of the daemon for one scrape, all of it under the caller's lock
/// (the endpoint itself reads the counters off the lock: [`serve`]).
pub fn snapshot(d: &Daemon) -> Result<Snapshot, crate::Error> {
    complete(held(d), d.maps())
}

/// Serves the daemon's metrics on `addr` (limiter_service::metrics: concurrent, with timeouts)
/// until a shutdown is broadcast.
pub async fn serve(
    addr: SocketAddr,
    daemon: Arc<Mutex<Daemon>>,
    shutdown: broadcast::Sender<Shutdown>,
) -> Result<(), crate::Error> {
    let mut stop = shutdown.subscribe();
    let listener = tokio::select! {
        _ = stop.recv() => return Ok(()),
        listener = limiter_service::metrics::bind(addr, "the daemon") => listener,
    };
    // The metrics' own handles on the maps the daemon pinned: reading them needs no lock.
    let pin_dir = daemon
        .lock()
        .map_err(|_| crate::Error::Service("daemon state poisoned".into()))?
        .config()
        .pin_dir
        .clone();
    let maps = Maps::from_pins(&pin_dir)?;
    // Weak: a scrape in flight must not keep the daemon's state alive past its exit.
    let daemon = Arc::downgrade(&daemon);
    let text = limiter_service::metrics::Cached::new(MAX_AGE);
    let render: limiter_service::metrics::Render = Arc::new(move || {
        text.get_or(|| {
            let held = {
                let daemon = daemon.upgrade().ok_or("the daemon is stopping")?;
                let daemon = daemon
                    .lock()
                    .map_err(|_| "daemon state is poisoned".to_string())?;
                held(&daemon)
            };
            complete(held, &maps)
                .map(|s| render(&s))
                .map_err(|e| e.to_string())
        })
    });
    limiter_service::metrics::serve(listener, render, async move {
        let _ = stop.recv().await;
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use limiter_common::abi::{GlobalCounters, HeaderCounters, RuleCounters, TunnelCounters};

    use super::*;
    use crate::observe::stats::{GlobalStats, RuleStats};

    #[test]
    fn renders_counters_gauges_and_states() {
        let snapshot = Snapshot {
            stats: StatsReport {
                rules: vec![RuleStats {
                    name: "we\"b".into(),
                    mode: crate::config::Mode::Enforce,
                    enforce_percent: crate::config::Percent::ALL,
                    state: ShareState::Standalone,
                    rate: Some(10),
                    burst: Some(5),
                    counters: RuleCounters {
                        passed_packets: 7,
                        passed_bytes: 700,
                        dropped_packets: 3,
                        dropped_bytes: 300,
                        would_drop_packets: 0,
                        would_drop_bytes: 0,
                        refused_early_packets: 0,
                        refused_early_bytes: 0,
                    },
                    sources_saturated: Some(true),
                    sources_aside: true,
                    sources_false_limit_ppm: Some(250_000),
                    // One of the 3 drops predates reason counting.
                    reasons: [(
                        DropReason::PerSource.label(),
                        ReasonCount {
                            dropped_packets: 2,
                            would_drop_packets: 0,
                        },
                    )]
                    .into(),
                }],
                global: GlobalStats {
                    counters: GlobalCounters {
                        malformed: 1,
                        non_ip: 2,
                        unmatched: 3,
                        sketch_unseeded: 4,
                        contended: 5,
                    },
                    headers: HeaderCounters {
                        fragments: 6,
                        tiny_fragments: 7,
                        orphan_fragments: 8,
                        overlapping_fragments: 9,
                        long_header_chains: 10,
                        deep_vlan_stacks: 11,
                    },
                    tunnels: TunnelCounters {
                        decapsulated: 15,
                        unreadable: 16,
                    },
                    handoff_missing: 12,
                    new_sources: 13,
                    source_refusals: 14,
                    sketch_busy_ppm: 250_000,
                    no_rule_reasons: [(
                        DropReason::DeepVlan.label(),
                        ReasonCount {
                            dropped_packets: 11,
                            would_drop_packets: 0,
                        },
                    )]
                    .into(),
                    monitor: limiter_common::drop::MonitorCounters {
                        sampled: 15,
                        skipped_budget: 16,
                        lost_full: 17,
                    },
                },
                bypass: true,
            },
            quotas: vec![
                QuotaEntry {
                    rule: "we\"b".into(),
                    unit: "packets",
                    rate: Some(10),
                    burst: Some(5),
                    source: "config",
                },
                QuotaEntry {
                    rule: "bulk".into(),
                    unit: "bytes",
                    rate: Some(1_000_000),
                    burst: Some(90_000),
                    source: "config",
                },
            ],
            sketch_width: 1024,
            program_runs: None,
            interfaces: vec![InterfaceState {
                name: "eth1".into(),
                hook: "xdp",
                attached: false,
                reattaches: 2,
            }],
            fleet: Some(FleetCounters {
                grants_refused: 6,
                credited: 41,
                report_failures: 9,
                tls_reload_failures: 2,
                fleet_size_disagreement: Some(crate::daemon::FleetSizeDisagreement {
                    host: 4,
                    allocator: 500,
                }),
            }),
            saturation: vec![RuleSaturation {
                rule: "we\"b".into(),
                saturated: true,
                false_limit_ratio: 0.25,
                transitions: 3,
            }],
            joined_slot_holds_limiter: Some(false),
        };
        let text = render(&snapshot);
        assert!(text.contains("limiter_joined_slot_holds_limiter 0\n"));
        assert!(text.contains("limiter_rule_sources_saturated{rule=\"we\\\"b\"} 1\n"));
        assert!(text.contains("limiter_rule_sources_false_limit_ratio{rule=\"we\\\"b\"} 0.25\n"));
        assert!(text
            .contains("limiter_rule_sources_saturation_transitions_total{rule=\"we\\\"b\"} 3\n"));
        assert!(text.contains("limiter_fleet_grants_refused_total 6\n"));
        assert!(text.contains("limiter_fleet_credited_packets_total 41\n"));
        assert!(text.contains("limiter_fleet_report_failures_total 9\n"));
        assert!(text.contains("limiter_fleet_tls_reload_failures_total 2\n"));
        assert!(text.contains("limiter_fleet_size_disagreement 1\n"));
        assert!(text.contains("limiter_interface_attached{interface=\"eth1\",hook=\"xdp\"} 0\n"));
        assert!(text.contains("limiter_interface_reattaches_total{interface=\"eth1\"} 2\n"));
        assert!(text.contains("limiter_rule_passed_packets_total{rule=\"we\\\"b\"} 7\n"));
        assert!(text.contains("limiter_rule_enforce_ratio{rule=\"we\\\"b\"} 1\n"));
        assert!(text.contains("limiter_rule_dropped_bytes_total{rule=\"we\\\"b\"} 300\n"));
        for line in [
            "limiter_rule_dropped_packets_total{rule=\"we\\\"b\",reason=\"aggregate\"} 0\n",
            "limiter_rule_dropped_packets_total{rule=\"we\\\"b\",reason=\"per_source\"} 2\n",
            "limiter_rule_dropped_packets_total{rule=\"we\\\"b\",reason=\"unattributed\"} 1\n",
            "limiter_rule_would_drop_packets_total{rule=\"we\\\"b\",reason=\"aggregate\"} 0\n",
            "limiter_dropped_packets_total{reason=\"deep_vlan\"} 11\n",
            "limiter_dropped_packets_total{reason=\"unreadable_tunnel\"} 0\n",
            "limiter_monitor_sampled_events_total 15\n",
            "limiter_monitor_lost_events_total{cause=\"budget\"} 16\n",
            "limiter_monitor_lost_events_total{cause=\"full\"} 17\n",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        assert!(
            !text.contains("limiter_rule_dropped_packets_total{rule=\"we\\\"b\"}"),
            "a dropped series without its reason"
        );
        assert!(text.contains("limiter_rule_rate_packets_per_second{rule=\"we\\\"b\"} 10\n"));
        assert!(text.contains("limiter_rule_burst_packets{rule=\"we\\\"b\"} 5\n"));
        assert!(text.contains("limiter_rule_rate_bytes_per_second{rule=\"bulk\"} 1000000\n"));
        assert!(text.contains("limiter_rule_burst_bytes{rule=\"bulk\"} 90000\n"));
        assert!(!text.contains("unit="), "a label mixes units");
        assert!(text.contains(&format!(
            "limiter_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(
            text.contains("# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ")
        );
        assert!(
            text.contains("limiter_rule_share_state{rule=\"we\\\"b\",state=\"standalone\"} 1\n")
        );
        assert!(text.contains("limiter_rule_share_state{rule=\"we\\\"b\",state=\"leased\"} 0\n"));
        assert!(text.contains("limiter_source_sketch_busy_ratio 0.25\n"));
        assert!(text.contains("limiter_source_sketch_width 1024\n"));
        assert!(text.contains("limiter_new_source_packets_total 13\n"));
        assert!(text.contains("limiter_bypass 1\n"));
        assert!(text.contains("limiter_contended_packets_total 5\n"));
        assert!(text.contains("limiter_tiny_fragment_packets_total 7\n"));
        // Said once, as `limiter_dropped_packets_total{reason="deep_vlan"}` above.
        assert!(!text.contains("limiter_deep_vlan_stack_packets_total"));
        assert!(!text.contains("limiter_tunnel_unreadable_packets_total"));
        assert!(text.contains("limiter_handoff_missing_packets_total 12\n"));
        assert!(!text.contains("limiter_program_runs_total"));
        // Every sample line belongs to a family announced with HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
        }
    }
}
