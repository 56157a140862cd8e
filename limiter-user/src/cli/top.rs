//! `limiter top`: the live view. The rates and the screen are `limiter_user::observe::top`'s
//! (pure); here are the terminal, the keys, the clock and the signals.

use std::{
    io::IsTerminal as _,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use limiter_user::observe::top::{
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
    /// Instead of the rules: the top throttled sources and source prefixes (/24, /64)
    /// among the sampled refusals of the last `--window` seconds, each with its share
    /// and that share's standard error. Reads the `DROP_EVENTS` ring buffer, as
    /// `limiter monitor` does (the two at once split the events).
    #[arg(long)]
    sources: bool,
    /// With `--sources`: the window, in seconds (1 to 3600).
    #[arg(long, default_value = "10", requires = "sources", value_parser = parse_window)]
    window: u64,
}

fn parse_window(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(s) if (1..=3600).contains(&s) => Ok(s),
        _ => Err(format!(
            "expected whole seconds from 1 to 3600, got {text:?}"
        )),
    }
}

/// Set by SIGTERM, SIGINT and SIGHUP: leave the screen as it was found, then exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// How often the loop looks at [`STOP`] while it waits for a key.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// What waiting on the terminal found.
#[derive(Debug, PartialEq, Eq)]
enum Input {
    /// Bytes to read: crossterm parses them.
    Waiting,
    /// Nothing within the time (or a signal interrupted the wait).
    Nothing,
    /// The terminal hung up (its window closed, the ssh session or tmux server died).
    Gone,
}

/// The terminal crossterm reads keys from, watched with poll(2) before crossterm is asked
/// for a key: on a hung-up terminal crossterm's reader retries a read that returns 0
/// bytes forever, inside its own loop, where neither [`STOP`] nor a key is ever seen (found
/// as a `top --sources` spinning an hour after its tmux server was killed). poll(2) says
/// POLLHUP there, and a signal interrupts it whatever SA_RESTART says.
struct Tty(std::os::fd::OwnedFd);

impl Tty {
    /// The descriptor crossterm reads: stdin when it is a terminal, else /dev/tty.
    fn open() -> anyhow::Result<Tty> {
        use std::os::fd::AsFd as _;
        let fd = if std::io::stdin().is_terminal() {
            std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating stdin")?
        } else {
            std::fs::File::open("/dev/tty")
                .context("opening /dev/tty for keys")?
                .into()
        };
        Ok(Tty(fd))
    }

    fn wait(&self, timeout: Duration) -> anyhow::Result<Input> {
        use std::os::fd::AsRawFd as _;
        let mut fds = [libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one pollfd, owned here, for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(Input::Nothing);
            }
            return Err(e).context("waiting for keys");
        }
        Ok(input_of(fds[0].revents))
    }
}

/// poll(2)'s answer for the terminal, as [`Input`]: a hang-up or an error wins over data
/// (a hung-up terminal reads as ready, with nothing to read).
fn input_of(revents: libc::c_short) -> Input {
    if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        Input::Gone
    } else if revents & libc::POLLIN != 0 {
        Input::Waiting
    } else {
        Input::Nothing
    }
}

/// A key or a resize, read only when [`Tty::wait`] found bytes waiting; `None` when
/// nothing arrived within `timeout` or the terminal is gone (`gone` is set).
fn next_event(tty: &Tty, timeout: Duration, gone: &mut bool) -> anyhow::Result<Option<Event>> {
    match tty.wait(timeout)? {
        Input::Gone => {
            *gone = true;
            Ok(None)
        }
        // Bytes to parse, or (nothing on the terminal) perhaps a resize, which arrives
        // through crossterm's SIGWINCH pipe.
        Input::Waiting | Input::Nothing => {
            if event::poll(Duration::ZERO).context("reading keys")? {
                return Ok(Some(event::read().context("reading keys")?));
            }
            Ok(None)
        }
    }
}

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
    if args.sources {
        return sources(pin_dir, args.interval, args.window);
    }
    let start = Instant::now();
    // Nothing pinned at start is an error, as for `stats`; later the view waits.
    let first = top::read(pin_dir, since_start(start))?;
    // SAFETY: installing handlers that only store to an atomic.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    let tty = Tty::open()?;
    let mut terminal = TerminalGuard::enter()?;
    run(&mut terminal.0, &tty, pin_dir, args.interval, start, first)
}

fn run(
    terminal: &mut DefaultTerminal,
    tty: &Tty,
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
            // A signal interrupts the wait: the loop's next turn sees it.
            let mut gone = false;
            let Some(event) = next_event(tty, (next_reading - now).min(SIGNAL_POLL), &mut gone)?
            else {
                if gone {
                    return Ok(());
                }
                continue;
            };
            match event {
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

/// How many sources and prefixes the `--sources` screen ranks.
const TOP_SOURCES: usize = 20;

/// `limiter top --sources`: reads the ring buffer continuously, ranks each `interval`.
fn sources(pin_dir: &Path, interval: Duration, window_s: u64) -> anyhow::Result<()> {
    use limiter_user::observe::monitor::{self, event::decode, sources::Window, ReaderClaim};
    use ratatui::{text::Line, widgets::Paragraph};

    let mut reader = monitor::Reader::open(pin_dir)?;
    let claim = ReaderClaim::claim(pin_dir);
    let config = reader.config()?;
    let start_counts = reader.counters()?;
    // SAFETY: installing handlers that only store to an atomic.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    let tty = Tty::open()?;
    let mut terminal = TerminalGuard::enter()?;
    let mut window = Window::new(window_s * 1_000_000_000);
    let mut next_draw = Instant::now();
    loop {
        if STOP.load(Ordering::Relaxed) {
            return Ok(());
        }
        reader.poll(Duration::ZERO, |raw| {
            if let Some(src) = decode(&raw).src {
                window.push(raw.time_ns, src);
            }
        })?;
        if Instant::now() >= next_draw {
            window.expire(monitor::monotonic_ns());
            let mut notes = vec![monitor::describe_counters(
                &reader.counters()?,
                &start_counts,
                &config,
            )];
            if let Err(warning) = &claim {
                notes.push(format!("warning: {warning}"));
            }
            if reader.bypass()? {
                notes.push("bypass is on: nothing is dropped or sampled".to_string());
            }
            if config.events_per_sec == 0 {
                notes.push("sampling is off (a budget of 0 events/s)".to_string());
            }
            let mut lines = monitor::sources::render(
                &window.top(TOP_SOURCES),
                window_s as f64,
                Some(&notes.join("; ")),
            );
            lines.push(format!("{}; q quits", time_of_day()));
            let text: Vec<Line> = lines.into_iter().map(Line::from).collect();
            terminal
                .0
                .draw(|frame| frame.render_widget(Paragraph::new(text), frame.area()))
                .context("drawing the screen")?;
            next_draw = Instant::now() + interval;
        }
        let mut gone = false;
        let event = next_event(&tty, SIGNAL_POLL, &mut gone)?;
        if gone {
            return Ok(());
        }
        if let Some(event) = event {
            match event {
                Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    _ => {}
                },
                Event::Resize(..) => next_draw = Instant::now(),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_up_terminal_is_gone_even_when_it_reads_as_ready() {
        assert_eq!(input_of(libc::POLLIN | libc::POLLHUP), Input::Gone);
        assert_eq!(input_of(libc::POLLERR), Input::Gone);
        assert_eq!(input_of(libc::POLLNVAL), Input::Gone);
        assert_eq!(input_of(libc::POLLIN), Input::Waiting);
        assert_eq!(input_of(0), Input::Nothing);
    }
}
