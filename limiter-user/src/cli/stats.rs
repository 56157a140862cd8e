use std::{
    io::{IsTerminal as _, Write as _},
    time::Duration,
};

use anyhow::Context as _;
use limiter_user::{
    bpf::maps::Maps,
    observe::{stats, top::rates::counter_rate},
};

use super::PinDirArg;

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pin_dir: PinDirArg,
    /// Print JSON (the shape in the README, "limiter stats") instead of a table.
    #[arg(long)]
    json: bool,
    /// Refresh the table every second until interrupted.
    #[arg(long, conflicts_with = "json")]
    watch: bool,
}

pub fn execute(args: StatsArgs) -> anyhow::Result<()> {
    let maps = Maps::from_pins(&args.pin_dir.pin_dir)?;
    if args.json {
        let report = stats::collect(&maps)?;
        println!(
            "{}",
            serde_json::to_string(&report).context("encoding JSON")?
        );
        return Ok(());
    }
    // (when, new_sources) of the previous refresh: `--watch` shows new sources per second.
    let mut previous: Option<(std::time::Instant, u64)> = None;
    loop {
        let report = stats::collect(&maps)?;
        let mut out = std::io::stdout().lock();
        if args.watch {
            if std::io::stdout().is_terminal() {
                // Clear the screen and home the cursor.
                write!(out, "\x1b[2J\x1b[H")?;
            } else {
                // A pipe or a log: one table after another, no screen control.
                writeln!(out, "---")?;
            }
        }
        write!(out, "{}", stats::render_table(&report))?;
        if args.watch {
            let now = (std::time::Instant::now(), report.global.new_sources);
            // `limiter top`'s arithmetic: a counter that went backwards (maps recreated)
            // counts from zero, never as a wrapped delta.
            if let Some(rate) =
                previous.and_then(|(at, seen)| counter_rate(seen, now.1, now.0.duration_since(at)))
            {
                writeln!(out, "new sources per second: {:.0}", rate.per_second)?;
            }
            previous = Some(now);
        }
        out.flush()?;
        if !args.watch {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
