//! The exit statuses of both binaries, defined once, and how a failure is told: each cause
//! once ([`render`]) and its status chosen by the types in its chain ([`classify`]).

use std::{error::Error, io};

/// Why a binary exits. `limiter check` and `limiter-allocator check` keep their own
/// contract: 0 when the file would be accepted, 1 when not, whatever the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Success,
    /// Anything not below.
    Failure,
    /// A command line clap refused (unknown option, missing argument).
    Usage,
    /// Bad input: the config file is missing, unreadable or invalid, or the daemon refused
    /// the request (an unknown rule, a quota out of bounds). Nothing changed.
    BadInput,
    /// The daemon (or allocator) is not running: nothing listens on its control socket,
    /// or (`stats`) its pinned maps are not there.
    NotRunning,
    /// The kernel refused: the verifier, an attach, a missing kernel feature, or a
    /// permission (not root, a capability missing).
    KernelRefused,
}

impl Exit {
    pub const ALL: [Exit; 6] = [
        Exit::Success,
        Exit::Failure,
        Exit::Usage,
        Exit::BadInput,
        Exit::NotRunning,
        Exit::KernelRefused,
    ];

    pub const fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            // clap's own status for a usage error.
            Exit::Usage => 2,
            Exit::BadInput => 3,
            Exit::NotRunning => 4,
            Exit::KernelRefused => 5,
        }
    }

    /// One line for `--help` and the README.
    pub const fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Failure => "failure (any other)",
            Exit::Usage => "usage: an unknown option or a missing argument",
            Exit::BadInput => {
                "bad input: the config file is missing, unreadable or invalid, or the daemon \
                 refused the request (unknown rule, quota out of bounds); nothing changed"
            }
            Exit::NotRunning => {
                "not running: nothing listens on the control socket (or no pinned maps)"
            }
            Exit::KernelRefused => {
                "the kernel refused: verifier, attach, a missing kernel feature, or permission \
                 (not root, a capability missing)"
            }
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

/// The `--help` text of the table (clap's `after_help`); a test checks it against [`Exit`].
pub const HELP: &str = "\
Exit status:
  0  success
  1  failure (any other); `check`: the file would be rejected
  2  usage: an unknown option or a missing argument
  3  bad input: the config file is missing, unreadable or invalid, or the daemon refused the
     request (unknown rule, quota out of bounds); nothing changed
  4  not running: nothing listens on the control socket (or no pinned maps)
  5  the kernel refused: verifier, attach, a missing kernel feature, or permission (not
     root, a capability missing)";

/// The status for `error`: the first cause, outermost first, that `specific` (the binary's
/// own error types, and `control::exit_status`) or the types known here classify; [`Exit::Failure`] when none does.
pub fn classify(
    error: &(dyn Error + 'static),
    specific: &dyn Fn(&(dyn Error + 'static)) -> Option<Exit>,
) -> Exit {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(exit) = specific(e).or_else(|| common(e)) {
            return exit;
        }
        cause = e.source();
    }
    Exit::Failure
}

/// What every binary meets: I/O errors (a permission the kernel or a file refused). The
/// control socket's errors are limiter_service::control's to classify
/// (`control::exit_status`, which the binaries ask first).
fn common(e: &(dyn Error + 'static)) -> Option<Exit> {
    let e = e.downcast_ref::<io::Error>()?;
    match e.kind() {
        io::ErrorKind::PermissionDenied => Some(Exit::KernelRefused),
        _ => None,
    }
}

/// `error` and its causes on one line, `: ` between them, each said once: a cause whose
/// text its parent already includes (thiserror's `"{what}: {source}"` with `#[source]`,
/// a context made with `format!("…: {e}")`, a library's own) is not said again.
pub fn render(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

/// The fragments of `text` (split at `: `) said more than once; a test helper for the
/// binaries' error tests. Short fragments (a word) may repeat legitimately.
pub fn repeated_fragments(text: &str) -> Vec<&str> {
    let fragments: Vec<&str> = text.split(": ").map(str::trim).collect();
    let mut repeated: Vec<&str> = Vec::new();
    for (i, f) in fragments.iter().enumerate() {
        if f.len() >= 12 && fragments[..i].contains(f) && !repeated.contains(f) {
            repeated.push(f);
        }
    }
    repeated
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{what}: {source}")]
    struct Repeats {
        what: &'static str,
        #[source]
        source: io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("starting")]
    struct Outer(#[source] Repeats);

    fn not_found() -> io::Error {
        io::Error::from(io::ErrorKind::NotFound)
    }

    #[test]
    fn a_cause_its_parent_already_says_is_said_once() {
        let e = Outer(Repeats {
            what: "/etc/limiter.toml: cannot read config",
            source: not_found(),
        });
        let text = render(&e);
        assert_eq!(
            text,
            format!(
                "starting: /etc/limiter.toml: cannot read config: {}",
                not_found()
            )
        );
        assert!(repeated_fragments(&text).is_empty(), "{text}");
        // And the chain as `{:#}` prints it would have said it twice.
        let naive = format!("{e}: {}: {}", e.0, e.0.source);
        assert_eq!(repeated_fragments(&naive), vec![not_found().to_string()]);
    }

    #[test]
    fn a_cause_not_said_by_its_parent_is_kept() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading the pins")]
        struct Quiet(#[source] io::Error);
        let e = Quiet(not_found());
        assert_eq!(render(&e), format!("reading the pins: {}", not_found()));
    }

    #[test]
    fn the_status_follows_the_types_in_the_chain() {
        let none = |_: &(dyn Error + 'static)| None;
        // A permission error deep in a chain: the kernel (or the socket's owner) refused.
        let denied = Outer(Repeats {
            what: "attaching",
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        });
        assert_eq!(classify(&denied, &none), Exit::KernelRefused);
        assert_eq!(
            classify(
                &Outer(Repeats {
                    what: "x",
                    source: not_found()
                }),
                &none
            ),
            Exit::Failure
        );
        // The binary's own types are asked first, outermost first.
        let specific = |e: &(dyn Error + 'static)| e.is::<Outer>().then_some(Exit::BadInput);
        assert_eq!(classify(&denied, &specific), Exit::BadInput);
    }

    #[test]
    fn the_help_table_lists_every_status_with_its_meaning() {
        let help: String = HELP.split_whitespace().collect::<Vec<_>>().join(" ");
        let codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), codes.len(), "two statuses share a code");
        for exit in Exit::ALL {
            let first_words: String = exit
                .meaning()
                .split_whitespace()
                .take(6)
                .collect::<Vec<_>>()
                .join(" ");
            let row = format!("{} {first_words}", exit.code());
            assert!(help.contains(&row), "--help lacks {row:?}: {help}");
        }
    }
}
