//! Metrics scrapes under hostile load cost the fleet's reports nothing: a daemon with
//! 1,024 rules reports to a real allocator with 1,024 quotas every second while 16
//! threads scrape the daemon's metrics and 16 the allocator's, back to back. The
//! allocator logs each report it answers (`report granted`, at debug level); the test
//! timestamps those lines as they arrive, so the cadence is measured outside the daemon.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use common::{fleet::Allocator, free_port, pki::Pki, Lab};
use limiter_tests::scenario::{with_retries, Checks, Premise};

const RULES: usize = 1024;
const INTERVAL_MS: u64 = 1000;
const LEASE_MS: u64 = 4000;
const SCRAPERS: usize = 16;
/// No report may come later than this share of the interval after the one before.
const LATE_TOLERANCE: f64 = 0.10;

fn rule_name(i: usize) -> String {
    format!("r{i:04}")
}

/// 1,024 rules, each on its own /32 in 198.18.4.0-198.18.7.255, reported to the allocator.
fn daemon_config(pki: &Pki, allocator_port: u16) -> String {
    let mut text = String::from("fleet_size = 1\n");
    for i in 0..RULES {
        text.push_str(&format!(
            "[[rules]]\nname = \"{}\"\ndst = \"198.18.{}.{}/32\"\nrate = 1000\nburst = 100\n",
            rule_name(i),
            4 + i / 256,
            i % 256
        ));
    }
    let pair = pki.pair("lb-1");
    text.push_str(&format!(
        "[fleet]\nallocator = \"127.0.0.1:{allocator_port}\"\nhost_id = \"lb-1\"\nca = \"{}\"\n\
         cert = \"{}\"\nkey = \"{}\"\nlease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {INTERVAL_MS}\n",
        pki.ca().display(),
        pair.cert.display(),
        pair.key.display()
    ));
    text
}

/// The allocator with a quota for every rule, logging each report it answers.
struct LoggingAllocator {
    child: Child,
    port: u16,
    metrics_port: u16,
    /// When each `report granted` line arrived.
    reports: Arc<Mutex<Vec<Instant>>>,
}

impl LoggingAllocator {
    fn start(dir: &Path, pki: &Pki) -> LoggingAllocator {
        let (port, metrics_port) = (free_port(), free_port());
        let server = pki.pair("allocator");
        let mut text = format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics = \"127.0.0.1:{metrics_port}\"\n\
             control_socket = \"{}\"\nlease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {INTERVAL_MS}\n\
             fleet_size = 1\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.join("allocator.sock").display(),
            pki.ca().display(),
            server.cert.display(),
            server.key.display()
        );
        for i in 0..RULES {
            text.push_str(&format!(
                "[[quotas]]\nrule = \"{}\"\nrate = 1000\nburst = 100\n",
                rule_name(i)
            ));
        }
        let config = dir.join("allocator.toml");
        std::fs::write(&config, text).unwrap();
        let mut child = Command::new(Allocator::binary())
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info,limiter_allocator=debug")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting limiter-allocator");
        let reports = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let seen = Arc::clone(&reports);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("report granted") && line.contains("lb-1") {
                    seen.lock().unwrap().push(Instant::now());
                } else if !line.contains("DEBUG") {
                    eprintln!("allocator: {line}");
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "allocator did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        LoggingAllocator {
            child,
            port,
            metrics_port,
            reports,
        }
    }

    fn report_count(&self) -> usize {
        self.reports.lock().unwrap().len()
    }

    /// Waits for `n` more reports (at most `n` intervals and 5 s more); returns the gaps
    /// between consecutive reports from the one before the first of them.
    fn gaps_over(&self, n: usize) -> Vec<Duration> {
        let start = self.report_count();
        let deadline = Instant::now() + Duration::from_millis(n as u64 * INTERVAL_MS + 5000);
        while self.report_count() < start + n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let reports = self.reports.lock().unwrap();
        let mut gaps: Vec<Duration> = reports[start.saturating_sub(1)..]
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .collect();
        // Reports that never came count as one gap up to now.
        if reports.len() < start + n {
            gaps.push(reports.last().map_or(Duration::MAX, Instant::elapsed));
        }
        gaps
    }
}

impl Drop for LoggingAllocator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GET /metrics; whether it answered 200 with `expect` in the body.
fn scrape_ok(port: u16, expect: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
    if stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = Vec::new();
    let _ = stream.read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    text.starts_with("HTTP/1.1 200") && text.contains(expect)
}

/// `SCRAPERS` threads scraping `port` back to back until `stop`; counts good answers.
fn scrape_loops(
    port: u16,
    expect: &'static str,
    stop: &Arc<AtomicBool>,
    answered: &Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..SCRAPERS)
        .map(|_| {
            let (stop, answered) = (Arc::clone(stop), Arc::clone(answered));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if scrape_ok(port, expect) {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

fn longest(gaps: &[Duration]) -> Duration {
    gaps.iter().copied().max().unwrap_or_default()
}

#[test]
fn sixteen_scrape_loops_delay_no_report() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = LoggingAllocator::start(dir.path(), &pki);
    let lab = Lab::new(&daemon_config(&pki, allocator.port));
    let daemon = lab.start();
    let interval = Duration::from_millis(INTERVAL_MS);
    let bound = interval.mul_f64(1.0 + LATE_TOLERANCE);
    // Reporting, and granted: the grants reinstall 1,024 rules at every report, the
    // daemon's real work while it is scraped.
    let started = Instant::now();
    while allocator.report_count() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the daemon did not report"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    with_retries("scrape load", 3, || {
        let mut checks = Checks::new();
        // Quiet first: the machine (shared, 2 CPUs) must keep the cadence on its own, or
        // the run proves nothing.
        let quiet = allocator.gaps_over(4);
        let premise: Premise = if longest(&quiet) > bound {
            Err(format!(
                "without scrapes a report came {:?} after the one before",
                longest(&quiet)
            ))
        } else {
            Ok(())
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (daemon_answers, allocator_answers) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut scrapers = scrape_loops(
            lab.metrics_port,
            "limiter_rule_passed_packets_total{rule=\"r1023\"}",
            &stop,
            &daemon_answers,
        );
        scrapers.extend(scrape_loops(
            allocator.metrics_port,
            "limiter_allocator_hosts{rule=\"r1023\"}",
            &stop,
            &allocator_answers,
        ));
        let loaded = allocator.gaps_over(8);
        stop.store(true, Ordering::Relaxed);
        for s in scrapers {
            s.join().unwrap();
        }
        let (d, a) = (
            daemon_answers.load(Ordering::Relaxed),
            allocator_answers.load(Ordering::Relaxed),
        );
        eprintln!(
            "gaps between reports (ms): quiet {:?}; under {SCRAPERS}+{SCRAPERS} scrape loops \
             ({d} daemon and {a} allocator scrapes answered) {:?}",
            quiet.iter().map(Duration::as_millis).collect::<Vec<_>>(),
            loaded.iter().map(Duration::as_millis).collect::<Vec<_>>()
        );
        checks.check(d > 0 && a > 0, || {
            format!("the scrapes were not answered: {d} by the daemon, {a} by the allocator")
        });
        checks.check(longest(&loaded) <= bound, || {
            format!(
                "under the scrape load a report came {:?} after the one before (interval \
                 {interval:?}, at most {bound:?})",
                longest(&loaded)
            )
        });
        (checks, premise)
    });
    daemon.stop();
}
