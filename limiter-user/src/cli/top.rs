//! `limiter top`: the live view. The rates and the screen are `limiter_user::top`'s
//! (pure); here are the terminal, the keys, the clock and the signals.

use std::{
    io::IsTerminal as _,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use limiter_user::top::{
    self,
    view::{self, Mode, Screen},
    Sample,
};
use ratatui::{
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    DefaultTerminal,
};

use super::PinDirArg;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pin_dir: PinDirArg,
    /// Seconds between readings (0.1 to 60; decimals allowed).
    #[arg(long, default_value = "1", value_parser = top::parse_interval)]
    interval: Duration,
}

/// Set by SIGTERM, SIGINT and SIGHUP: leave the screen as it was found, then exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// How often the loop looks at [`STOP`] while it waits for a key.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// The terminal in raw mode on the alternate screen, given back as it was found when
/// dropped (on a return or an error); ratatui's panic hook does the same on a panic.
struct TerminalGuard(DefaultTerminal);

impl TerminalGuard {
    fn enter() -> anyhow::Result<TerminalGuard> {
        match ratatui::try_init() {
            Ok(terminal) => Ok(TerminalGuard(terminal)),
            Err(e) => {
                // Raw mode may be on already; give the terminal back before the error.
                ratatui::restore();
                Err(e).context("setting up the terminal")
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = self.0.show_cursor();
        ratatui::restore();
    }
}

fn since_start(start: Instant) -> Duration {
    start.elapsed()
}

/// The time of day now, `HH:MM:SS UTC`, for the title: each reading shows when it was
/// taken (UTC: no time zone database to read).
fn time_of_day() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

pub fn execute(args: TopArgs) -> anyhow::Result<()> {
    // A screen drawn into a pipe or a file is escape codes, not text: say what to use.
    if !std::io::stdout().is_terminal() {
        bail!(
            "limiter top draws a live screen and needs a terminal on stdout; for plain text \
             use `limiter stats --watch` (a table refreshed every second) or `limiter stats \
             --json` (one reading, for scripts)"
        );
    }
    let pin_dir = args.pin_dir.pin_dir.as_path();
    let start = Instant::now();
    // Nothing pinned at start is an error, as for `stats`; later the view waits.
    let first = top::read(pin_dir, since_start(start))?;
    // SAFETY: installing handlers that only store to an atomic.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    let mut terminal = TerminalGuard::enter()?;
    run(&mut terminal.0, pin_dir, args.interval, start, first)
}

fn run(
    terminal: &mut DefaultTerminal,
    pin_dir: &Path,
    interval: Duration,
    start: Instant,
    first: Sample,
) -> anyhow::Result<()> {
    let mut mode = Mode::Rates;
    let mut rates = top::rates(None, &first);
    let mut latest = Some(first);
    let mut problem: Option<String> = None;
    let mut taken = time_of_day();
    let mut next_reading = Instant::now() + interval;
    loop {
        terminal
            .draw(|frame| {
                view::draw(
                    frame,
                    &Screen {
                        pin_dir,
                        interval,
                        mode,
                        rates: &rates,
                        taken: &taken,
                        problem: problem.as_deref(),
                    },
                )
            })
            .context("drawing the screen")?;
        // Wait for the next reading, a key, or a signal.
        loop {
            if STOP.load(Ordering::Relaxed) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_reading {
                break;
            }
            let key_waiting = match event::poll((next_reading - now).min(SIGNAL_POLL)) {
                Ok(waiting) => waiting,
                // A signal may interrupt the wait: the loop's next turn sees it.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("reading keys"),
            };
            if !key_waiting {
                continue;
            }
            match event::read().context("reading keys")? {
                Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char('t') => {
                        mode = mode.toggled();
                        break;
                    }
                    _ => {}
                },
                Event::Resize(..) => break,
                _ => {}
            }
        }
        if Instant::now() < next_reading {
            continue; // a key or a resize: redraw what we have
        }
        match top::read(pin_dir, since_start(start)) {
            Ok(sample) => {
                rates = top::rates(latest.as_ref(), &sample);
                latest = Some(sample);
                taken = time_of_day();
                problem = None;
            }
            Err(e) => {
                // Pins gone (`detach`) or unreadable: keep the last good screen, say why,
                // and measure afresh from the next good reading.
                problem = Some(format!("{e:#}"));
                latest = None;
            }
        }
        next_reading += interval;
        // A slow reading or a suspended process: never a burst of catch-up readings.
        if next_reading <= Instant::now() {
            next_reading = Instant::now() + interval;
        }
    }
}
