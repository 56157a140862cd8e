//! `limiter monitor`: the sampled refusals as they happen, read from the pinned
//! `DROP_EVENTS` ring buffer (no daemon needed). Decoding, lines, JSON, pcapng and
//! filters are `limiter_user::observe::monitor`'s (pure); here are the loop, the clock, the
//! signals and the files.

use std::{
    fs::File,
    io::{BufWriter, Write as _},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use ipnet::IpNet;
use limiter_common::drop::DropReason;
use limiter_user::observe::monitor::{
    self,
    event::decode,
    filter::{parse_reason, parse_source, Filter},
    format::{self, Context},
    pcapng::PcapWriter,
    ReaderClaim,
};

use super::PinDirArg;

#[derive(Debug, clap::Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pin_dir: PinDirArg,
    /// One JSON object per event, a line (NDJSON), instead of text; fields in
    /// docs/operations.md.
    #[arg(long)]
    json: bool,
    /// Also write the sampled frames to FILE as pcapng (for tshark, Wireshark, tcpdump),
    /// each packet with a comment naming verdict, reason and rule.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Only events of this rule (repeat for several).
    #[arg(long = "rule", value_name = "NAME")]
    rules: Vec<String>,
    /// Only events of this reason (repeat for several): aggregate, per_source,
    /// share_closed, share_spent, tiny_fragment, orphan_fragment, overlapping_fragment,
    /// long_header_chain, deep_vlan, unreadable_tunnel.
    #[arg(long = "reason", value_name = "LABEL", value_parser = parse_reason)]
    reasons: Vec<DropReason>,
    /// Only events from sources in this prefix, v4 or v6 (repeat for several).
    #[arg(long = "source", value_name = "PREFIX", value_parser = parse_source)]
    sources: Vec<IpNet>,
    /// Exit after this many events (those the filters let through).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Exit after this long (e.g. 30s, 500ms, 2m; a bare number is seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,
}

/// `30s`, `500ms`, `2m`, `1h`, or bare seconds (decimals allowed).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("expected a duration such as 30s, 500ms or 2m, got {text:?}"))?;
    let seconds = value * scale;
    if !seconds.is_finite() || seconds <= 0.0 || seconds > 1e9 {
        return Err(format!("expected a positive duration, got {text:?}"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Set by SIGTERM, SIGINT and SIGHUP: print the counters, flush the capture, exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// How long one wait on the ring buffer lasts: how soon a signal or the end is seen.
const POLL: Duration = Duration::from_millis(100);
/// How often text mode repeats the sampling counters when they moved.
const COUNTERS_EVERY: Duration = Duration::from_secs(10);

pub fn execute(args: MonitorArgs) -> anyhow::Result<()> {
    let pin_dir = args.pin_dir.pin_dir.as_path();
    let mut reader = monitor::Reader::open(pin_dir)?;
    let _claim = match ReaderClaim::claim(pin_dir) {
        Ok(claim) => Some(claim),
        Err(warning) => {
            eprintln!("warning: {warning}");
            None
        }
    };
    let filter = Filter {
        rules: args.rules,
        reasons: args.reasons,
        sources: args.sources,
    };
    let config = reader.config()?;
    if reader.bypass()? {
        eprintln!(
            "bypass is on: every frame passes unmetered, nothing is dropped or sampled \
             (`limiter bypass off` to enforce)"
        );
    }
    if config.events_per_sec == 0 {
        eprintln!(
            "sampling is off (the daemon's budget is 0 events/s): no events will come until \
             it is set"
        );
    }
    let start_counts = reader.counters()?;
    let offset = monitor::wall_offset_ns();
    let mut pcap = match &args.pcap {
        Some(path) => {
            let file = File::create(path)
                .with_context(|| format!("creating the capture {}", path.display()))?;
            Some(
                PcapWriter::new(
                    BufWriter::new(file),
                    concat!("limiter ", env!("CARGO_PKG_VERSION")),
                )
                .with_context(|| format!("writing {}", path.display()))?,
            )
        }
        None => None,
    };
    // SAFETY: installing handlers that only store to an atomic.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    let started = Instant::now();
    // The ring buffer keeps what no one read (up to ~4,800 events, however old): a
    // monitor shows what happens from its start, which its counters describe too.
    let started_ns = monitor::monotonic_ns();
    let mut last_counts_shown = (Instant::now(), start_counts);
    let mut shown: u64 = 0;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failure: Option<anyhow::Error> = None;
    'outer: loop {
        if STOP.load(Ordering::Relaxed)
            || args.count.is_some_and(|n| shown >= n)
            || args.duration.is_some_and(|d| started.elapsed() >= d)
        {
            break;
        }
        let wait = args
            .duration
            .map_or(POLL, |d| d.saturating_sub(started.elapsed()).min(POLL));
        let mut batch = Vec::new();
        reader.poll(wait, |raw| batch.push(raw))?;
        for raw in batch {
            if raw.time_ns < started_ns {
                continue;
            }
            let e = decode(&raw);
            let rule = reader.rule_name(e.rule_slot);
            if !filter.matches(&e, &rule) {
                continue;
            }
            let cx = Context {
                rule,
                interface: monitor::interface_name(e.ifindex),
                wall_ns: i128::from(e.time_ns) + offset,
            };
            let written = if args.json {
                writeln!(out, "{}", format::json(&e, &cx))
            } else {
                writeln!(out, "{}", format::line(&e, &cx))
            };
            if let Err(err) = written {
                // A closed pipe (`| head`) ends the monitor quietly.
                if err.kind() != std::io::ErrorKind::BrokenPipe {
                    failure = Some(anyhow::Error::new(err).context("writing to stdout"));
                }
                break 'outer;
            }
            if let Some(w) = pcap.as_mut() {
                w.write(&e, &cx).context("writing the capture")?;
            }
            shown += 1;
            if args.count.is_some_and(|n| shown >= n) {
                break;
            }
        }
        let _ = out.flush();
        // Flushed at each batch: a capture killed mid-way is still readable.
        if let Some(w) = pcap.as_mut() {
            w.flush().context("writing the capture")?;
        }
        if !args.json && last_counts_shown.0.elapsed() >= COUNTERS_EVERY {
            let now = reader.counters()?;
            if now.skipped_budget != last_counts_shown.1.skipped_budget
                || now.lost_full != last_counts_shown.1.lost_full
            {
                eprintln!(
                    "{}",
                    monitor::describe_counters(&now, &start_counts, &config)
                );
            }
            last_counts_shown = (Instant::now(), now);
        }
    }
    if let Some(w) = pcap.as_mut() {
        w.flush().context("writing the capture")?;
    }
    eprintln!(
        "{} events shown; {}",
        shown,
        monitor::describe_counters(&reader.counters()?, &start_counts, &config)
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_the_usual_spellings() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "0", "-1s", "soon", "NaNs", "infs"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
