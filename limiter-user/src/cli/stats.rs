use std::{io::Write as _, time::Duration};

use anyhow::Context as _;
use limiter_user::{maps::Maps, stats};

use super::PinDirArg;

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pin_dir: PinDirArg,
    /// Print JSON (the shape in DESIGN.md) instead of a table.
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
    loop {
        let report = stats::collect(&maps)?;
        let mut out = std::io::stdout().lock();
        if args.watch {
            // Clear the screen and home the cursor.
            write!(out, "\x1b[2J\x1b[H")?;
        }
        write!(out, "{}", stats::render_table(&report))?;
        out.flush()?;
        if !args.watch {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
