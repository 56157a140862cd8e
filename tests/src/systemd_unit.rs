//! What systemd does when a service's main process exits: systemd.service(5)'s table for
//! `Restart=` with `SuccessExitStatus=` and `RestartPreventExitStatus=`, read from a unit
//! file. The machines the suite runs on have no systemd as PID 1; the package's own guest
//! test is where real `systemctl` runs. This lets a test hold the shipped unit against the
//! exit statuses the real daemon gives.

use std::{os::unix::process::ExitStatusExt as _, process::ExitStatus};

/// The restart policy of a `[Service]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPolicy {
    /// `Restart=` (systemd's default: `no`).
    pub restart: String,
    /// `RestartPreventExitStatus=`: exit codes and signal numbers.
    pub prevent: Vec<Reason>,
    /// `SuccessExitStatus=`: more clean exit codes and signals.
    pub success: Vec<Reason>,
}

/// How a main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Code(i32),
    Signal(i32),
}

impl Reason {
    pub fn of(status: ExitStatus) -> Reason {
        match (status.code(), status.signal()) {
            (Some(code), _) => Reason::Code(code),
            (None, Some(signal)) => Reason::Signal(signal),
            (None, None) => unreachable!("a process ends with a code or a signal"),
        }
    }
}

fn signal_number(name: &str) -> Option<i32> {
    let name = name.strip_prefix("SIG").unwrap_or(name);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ABRT" => libc::SIGABRT,
        "KILL" => libc::SIGKILL,
        "SEGV" => libc::SIGSEGV,
        "PIPE" => libc::SIGPIPE,
        "TERM" => libc::SIGTERM,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        _ => return None,
    })
}

fn reasons(value: &str) -> Result<Vec<Reason>, String> {
    value
        .split_whitespace()
        .map(|word| match word.parse::<i32>() {
            Ok(code) => Ok(Reason::Code(code)),
            Err(_) => signal_number(word)
                .map(Reason::Signal)
                .ok_or_else(|| format!("not an exit status or signal: {word:?}")),
        })
        .collect()
}

impl RestartPolicy {
    /// The `[Service]` section's policy; repeated list keys add up, as in systemd.
    pub fn parse(unit: &str) -> Result<RestartPolicy, String> {
        let mut policy = RestartPolicy {
            restart: "no".into(),
            prevent: Vec::new(),
            success: Vec::new(),
        };
        let mut in_service = false;
        for line in unit.lines().map(str::trim) {
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if !in_service || line.starts_with('#') {
                continue;
            }
            match key.trim() {
                "Restart" => policy.restart = value.trim().to_string(),
                "RestartPreventExitStatus" => policy.prevent.extend(reasons(value)?),
                "SuccessExitStatus" => policy.success.extend(reasons(value)?),
                _ => {}
            }
        }
        Ok(policy)
    }

    /// Whether systemd starts the service again after its main process ended so, not
    /// stopped by systemd itself (systemd.service(5), "Restart=", the table of exit
    /// causes; no timeouts or watchdog here).
    pub fn restarts(&self, how: Reason) -> bool {
        if self.prevent.contains(&how) {
            return false;
        }
        let clean = match how {
            Reason::Code(0) => true,
            Reason::Signal(s) => {
                [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE].contains(&s)
                    || self.success.contains(&how)
            }
            code => self.success.contains(&code),
        };
        let signal = matches!(how, Reason::Signal(_));
        match self.restart.as_str() {
            "always" => true,
            "on-success" => clean,
            "on-failure" => !clean,
            "on-abnormal" | "on-abort" => signal && !clean,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_systemd_service_5() {
        let unit = |restart: &str| {
            RestartPolicy::parse(&format!(
                "[Unit]\nRestart=always\n[Service]\nRestart={restart}\n\
                 RestartPreventExitStatus=3\nRestartPreventExitStatus=SIGUSR1\n"
            ))
            .unwrap()
        };
        let kill = Reason::Signal(libc::SIGKILL);
        let term = Reason::Signal(libc::SIGTERM);
        // (policy, clean 0, exit 1, SIGTERM, SIGKILL)
        for (restart, expected) in [
            ("no", [false, false, false, false]),
            ("always", [true, true, true, true]),
            ("on-success", [true, false, true, false]),
            ("on-failure", [false, true, false, true]),
            ("on-abnormal", [false, false, false, true]),
        ] {
            let policy = unit(restart);
            let got = [Reason::Code(0), Reason::Code(1), term, kill].map(|r| policy.restarts(r));
            assert_eq!(got, expected, "Restart={restart}");
            assert!(
                !policy.restarts(Reason::Code(3)),
                "Restart={restart}, exit 3"
            );
            assert!(
                !policy.restarts(Reason::Signal(libc::SIGUSR1)),
                "Restart={restart}, SIGUSR1"
            );
        }
        assert_eq!(unit("always").prevent.len(), 2);
        assert!(RestartPolicy::parse("[Service]\nRestartPreventExitStatus=SIGFOO\n").is_err());
    }
}
