//! What the daemon says when the kernel's verifier refuses one of the program's builds.
//!
//! The kernel answers BPF_PROG_LOAD with an errno and a log. The log of a refusal ends
//! with the instruction that failed and why ("R9 !read_ok", "invalid access to packet"),
//! followed by the verifier's statistics; the operator needs that tail, the build, and
//! the kernel it ran on, not the thousands of lines before it. The formatting here is
//! pure so it is tested on captured logs.

use std::fmt;

use crate::host::kernel::Version;

/// How many lines of the log's end the error carries: enough for the failing
/// instruction, the register state before it and the statistics.
pub const LOG_TAIL_LINES: usize = 20;

/// The verifier's complexity limit (BPF_COMPLEXITY_LIMIT_INSNS, include/linux/bpf.h):
/// instructions processed, counting every path, for a privileged loader (since 5.2).
pub const COMPLEXITY_LIMIT_INSNS: u64 = 1_000_000;

/// The most instructions the verifier may process for any build of the program on any
/// kernel the project supports (`tests/tests/kernel_report.rs` holds every build to it):
/// a quarter of [`COMPLEXITY_LIMIT_INSNS`], so that a change to the parser or the meter
/// that multiplies the verifier's paths fails a test long before a kernel refuses it.
pub const BUDGET_INSNS: u64 = 250_000;

/// A build of the program the kernel refused to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The program's name in the object (`limiter_linear`, `limiter`, `limiter_tc`).
    pub program: &'static str,
    /// The build, as the README and the logs call it (`linear`, `multi-buffer`, `tc`).
    pub build: &'static str,
    /// The running kernel's version (aya's reading: Debian's package version first).
    pub kernel: Option<Version>,
    /// `uname -r`.
    pub release: Option<String>,
    /// The errno of BPF_PROG_LOAD.
    pub errno: Option<i32>,
    /// The errno's text (`Permission denied (os error 13)`).
    pub error: String,
    /// The last [`LOG_TAIL_LINES`] non-empty lines of the verifier log.
    pub log_tail: Vec<String>,
    /// Non-empty lines in the whole log.
    pub log_lines: usize,
    /// Instructions the verifier processed, if the log says.
    pub processed_insns: Option<u64>,
    /// The log says the verifier stopped at its complexity limit.
    pub too_large: bool,
}

impl Refusal {
    /// Reads what matters out of the kernel's answer.
    pub fn new(
        program: &'static str,
        build: &'static str,
        kernel: Option<Version>,
        release: Option<String>,
        io_error: &std::io::Error,
        log: &str,
    ) -> Refusal {
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        let processed_insns = lines.iter().rev().find_map(|l| processed_insns(l));
        let too_large = lines.iter().any(|l| l.contains("BPF program is too large"))
            || processed_insns.is_some_and(|n| n >= COMPLEXITY_LIMIT_INSNS);
        Refusal {
            program,
            build,
            kernel,
            release,
            errno: io_error.raw_os_error(),
            error: io_error.to_string(),
            log_tail: tail.iter().map(|l| l.trim_end().to_string()).collect(),
            log_lines: lines.len(),
            processed_insns,
            too_large,
        }
    }
}

/// `N` of "processed N insns (limit 1000000) ..." (the statistics line, log level 4) or
/// of "BPF program is too large. Processed N insn".
fn processed_insns(line: &str) -> Option<u64> {
    let lower = line.to_ascii_lowercase();
    let rest = &lower[lower.find("processed ")? + "processed ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if !rest[digits.len()..].trim_start().starts_with("insn") {
        return None;
    }
    digits.parse().ok()
}

/// The symbolic name of the errnos BPF_PROG_LOAD returns, and what each means here.
fn errno_meaning(errno: i32) -> Option<(&'static str, &'static str)> {
    Some(match errno {
        libc::EACCES => ("EACCES", "the verifier found an unsafe or unprovable path"),
        libc::EINVAL => (
            "EINVAL",
            "the kernel does not know an instruction, helper, flag or program type the build uses",
        ),
        libc::E2BIG => ("E2BIG", "the program exceeds a size limit of this kernel"),
        libc::EPERM => (
            "EPERM",
            "not permitted: the daemon needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (or root)",
        ),
        libc::ENOMEM => (
            "ENOMEM",
            "the kernel ran out of memory (locked memory limit?)",
        ),
        libc::ENOSPC => ("ENOSPC", "the verifier log did not fit its buffer"),
        _ => return None,
    })
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the kernel's verifier refused the {} build (program `{}`)",
            self.build, self.program
        )?;
        match (&self.kernel, &self.release) {
            (Some(v), Some(r)) => write!(f, " on Linux {v} (release {r})")?,
            (Some(v), None) => write!(f, " on Linux {v}")?,
            (None, Some(r)) => write!(f, " on Linux release {r}")?,
            (None, None) => write!(f, " on a kernel whose version could not be read")?,
        }
        write!(f, ": {}", self.error)?;
        if let Some((name, meaning)) = self.errno.and_then(errno_meaning) {
            write!(f, " [{name}: {meaning}]")?;
        }
        write!(
            f,
            ". Nothing was attached and no link or map entry changed: a program already \
             attached keeps running with its rules and counters."
        )?;
        if self.log_tail.is_empty() {
            write!(f, "\nthe kernel returned no verifier log")?;
        } else {
            write!(
                f,
                "\nverifier log, last {} of {} lines:",
                self.log_tail.len(),
                self.log_lines
            )?;
            for line in &self.log_tail {
                write!(f, "\n  | {line}")?;
            }
        }
        if self.too_large {
            write!(
                f,
                "\nhint: the verifier gave up at its complexity limit of {COMPLEXITY_LIMIT_INSNS} \
                 processed instructions (1M, counting every path it explores{}). This kernel's \
                 verifier explores more paths than newer ones prune: the build needs fewer \
                 branches before it can load here.",
                self.processed_insns
                    .map(|n| format!("; it processed {n}"))
                    .unwrap_or_default()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use proptest::prelude::*;

    use super::*;

    /// The log of a real refusal: the multi-buffer build with its first instruction
    /// patched into a load through the uninitialised r9 (tests/verifier.rs makes it),
    /// refused by this machine's 6.18.44 kernel.
    const UNINIT_REGISTER_LOG: &str = "\
0: R1=ctx() R10=fp0
; #[xdp(frags)] @ main.rs:30
0: (79) r0 = *(u64 *)(r9 +0)
R9 !read_ok
verification time 561 usec
stack depth 0
processed 1 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0
";

    /// The shape of a complexity-limit refusal (kernel/bpf/verifier.c, do_check():
    /// "BPF program is too large. Processed %d insn"), followed by its statistics line.
    const TOO_LARGE_LOG: &str = "\
1234: (bf) r1 = r6
1235: (85) call bpf_map_lookup_elem#1
BPF program is too large. Processed 1000001 insn
processed 1000001 insns (limit 1000000) max_states_per_insn 35 total_states 41236 peak_states 9120 mark_read 47
";

    fn refusal(errno: i32, log: &str) -> Refusal {
        Refusal::new(
            "limiter",
            "multi-buffer",
            Some(Version::new(6, 1, 170)),
            Some("6.1.0-57-amd64".into()),
            &std::io::Error::from_raw_os_error(errno),
            log,
        )
    }

    #[test]
    fn a_refusal_names_build_kernel_errno_and_the_failing_line() {
        let text = refusal(libc::EACCES, UNINIT_REGISTER_LOG).to_string();
        assert!(
            text.contains("multi-buffer build (program `limiter`)"),
            "{text}"
        );
        assert!(
            text.contains("Linux 6.1.170 (release 6.1.0-57-amd64)"),
            "{text}"
        );
        assert!(
            text.contains("os error 13") && text.contains("EACCES"),
            "{text}"
        );
        assert!(text.contains("  | R9 !read_ok"), "{text}");
        assert!(text.contains("last 7 of 7 lines"), "{text}");
        assert!(text.contains("keeps running"), "{text}");
        assert!(
            !text.contains("hint:"),
            "no complexity hint for a small program: {text}"
        );
    }

    #[test]
    fn the_complexity_limit_gets_its_hint() {
        let r = refusal(libc::E2BIG, TOO_LARGE_LOG);
        assert!(r.too_large);
        assert_eq!(r.processed_insns, Some(1_000_001));
        let text = r.to_string();
        assert!(text.contains("complexity limit of 1000000"), "{text}");
        assert!(text.contains("it processed 1000001"), "{text}");
        assert!(text.contains("BPF program is too large"), "{text}");
    }

    #[test]
    fn an_empty_log_is_said_so() {
        let text = refusal(libc::EINVAL, "").to_string();
        assert!(text.contains("no verifier log"), "{text}");
        assert!(text.contains("EINVAL"), "{text}");
    }

    #[test]
    fn processed_is_read_from_both_line_shapes() {
        assert_eq!(
            processed_insns("processed 42 insns (limit 1000000) max_states_per_insn 0"),
            Some(42)
        );
        assert_eq!(
            processed_insns("BPF program is too large. Processed 1000001 insn"),
            Some(1_000_001)
        );
        assert_eq!(processed_insns("R9 !read_ok"), None);
        assert_eq!(processed_insns("processed the frame"), None);
    }

    proptest! {
        /// Whatever the log, the error carries exactly its last non-empty lines, in
        /// order, and never more than LOG_TAIL_LINES of them.
        #[test]
        fn the_tail_is_the_logs_last_lines(
            lines in proptest::collection::vec("[ -~]{0,30}", 0..60)
        ) {
            let log = lines.join("\n");
            let r = refusal(libc::EACCES, &log);
            let kept: Vec<String> = lines
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.trim_end().to_string())
                .collect();
            let want = &kept[kept.len().saturating_sub(LOG_TAIL_LINES)..];
            prop_assert_eq!(&r.log_tail[..], want);
            prop_assert_eq!(r.log_lines, kept.len());
            let text = r.to_string();
            for line in want {
                let shown = format!("  | {line}");
                prop_assert!(text.contains(&shown));
            }
        }
    }
}
