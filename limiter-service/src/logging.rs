//! Both binaries log the same way: to stderr, at `info` unless `RUST_LOG` says otherwise,
//! as text or (`--log-format json`) one JSON object a line. Text is coloured only when
//! stderr is a terminal: under systemd, journald would store the escape codes as bytes.

use std::io::IsTerminal as _;

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target` and `fields` (with `message`).
    Json,
}

/// `--log-format`, a global option of both binaries.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct LogArgs {
    /// How to write log lines on stderr: text (coloured only on a terminal) or json (one
    /// object a line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Installs the log subscriber. Call once, first thing in `main` after parsing arguments.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(colour(std::io::stderr().is_terminal()))
            .init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Colour on a terminal, unless `NO_COLOR` (no-color.org) is set to anything non-empty.
fn colour(stderr_is_terminal: bool) -> bool {
    stderr_is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Says why `binary` fails, once, the way its logs go: `binary: message` on stderr, or
/// with `--log-format json` an `error` event (so every line on stderr is JSON).
pub fn failure(format: LogFormat, binary: &str, message: &str, exit_status: u8) {
    match format {
        LogFormat::Text => eprintln!("{binary}: {message}"),
        LogFormat::Json => tracing::error!(exit_status, "{message}"),
    }
}
