//! The legitimate load, from the clients' namespace: per LB, wrk over keep-alive
//! connections (a request every `wrk_delay_ms` on each, run in segments so every minute
//! has its own latency distribution) and a curl loop making new connections, each from
//! another source of 198.18.64.0/24, every request's status and time recorded.

use std::{
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use limiter_tests::netns::spawn_in_netns;

use super::topology::{client_source, in_ns, vip};
use crate::fleet_lab::fleet::spawn_tied;

/// One curl request: when it started (s since the run's start), which LB, its HTTP status
/// (0: no response) and its time in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct CurlRecord {
    pub t: f64,
    pub lb: usize,
    pub code: u16,
    pub seconds: f64,
}

impl WrkSegment {
    /// Requests attempted (answered or failed on the socket) and those that succeeded.
    pub fn attempted_and_ok(&self) -> (u64, u64) {
        (
            self.requests + self.socket_errors,
            self.requests.saturating_sub(self.non_2xx + self.timeouts),
        )
    }
}

impl CurlRecord {
    pub fn ok(&self) -> bool {
        self.code == 200
    }
}

/// curl's `-w '%{http_code} %{time_total}'`: the status and seconds.
pub fn parse_curl(line: &str) -> Option<(u16, f64)> {
    let mut words = line.split_whitespace();
    let code = words.next()?.parse().ok()?;
    let seconds = words.next()?.parse().ok()?;
    Some((code, seconds))
}

/// One wrk segment on one LB.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkSegment {
    pub lb: usize,
    /// Start and end, s since the run's start.
    pub from: f64,
    pub to: f64,
    /// Responses received.
    pub requests: u64,
    /// Socket errors: connect, read, write (no response).
    pub socket_errors: u64,
    /// Responses later than `--timeout` (wrk counts them among the responses too).
    pub timeouts: u64,
    /// Responses other than 2xx/3xx.
    pub non_2xx: u64,
    /// Latency percentiles, seconds (wrk's `--latency`: 50, 75, 90, 99).
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// `1.23ms`, `812.00us`, `1.02s`, `2.00m` → seconds.
fn duration(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    })
}

/// wrk's report (with `--latency`) → requests, errors, p50 and p99.
pub fn parse_wrk(text: &str) -> WrkSegment {
    let mut s = WrkSegment::default();
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", d] => s.p50 = duration(d),
            ["99%", d] => s.p99 = duration(d),
            [n, "requests", "in", ..] => s.requests = n.parse().unwrap_or(0),
            ["Socket", "errors:", rest @ ..] => {
                for pair in rest.chunks(2) {
                    let n: u64 = pair
                        .get(1)
                        .and_then(|w| w.trim_end_matches(',').parse().ok())
                        .unwrap_or(0);
                    match pair[0] {
                        "timeout" => s.timeouts += n,
                        _ => s.socket_errors += n,
                    }
                }
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => s.non_2xx = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    s
}

/// The legitimate load's threads; stopped (and their processes ended) on drop.
pub struct Clients {
    running: Arc<AtomicBool>,
    /// Bumped by [`Clients::cut`]: each wrk ends its segment (SIGINT: it reports what it
    /// measured) and starts the next, so that segments follow the phases and minutes.
    generation: Arc<AtomicU64>,
    threads: Vec<JoinHandle<Result<()>>>,
    pub curl: Arc<Mutex<Vec<CurlRecord>>>,
    pub wrk: Arc<Mutex<Vec<WrkSegment>>>,
}

impl Clients {
    /// Starts, per LB, a wrk thread (one segment until each [`Clients::cut`], at most an
    /// hour each) and a curl loop; times are measured from `epoch`.
    pub fn start(
        ns: &str,
        lbs: usize,
        c: &super::SoakConfig,
        dir: &std::path::Path,
        epoch: Instant,
    ) -> Result<Clients> {
        let script = dir.join("wrk-delay.lua");
        std::fs::write(
            &script,
            format!("function delay()\n  return {}\nend\n", c.wrk_delay_ms),
        )
        .with_context(|| format!("writing {}", script.display()))?;
        let mut clients = Clients {
            running: Arc::new(AtomicBool::new(true)),
            generation: Arc::default(),
            threads: Vec::new(),
            curl: Arc::default(),
            wrk: Arc::default(),
        };
        for lb in 1..=lbs {
            let (running, wrk) = (Arc::clone(&clients.running), Arc::clone(&clients.wrk));
            let generation = Arc::clone(&clients.generation);
            let (wrk_ns, script, conns) = (ns.to_string(), script.clone(), c.wrk_connections);
            clients.threads.push(std::thread::spawn(move || {
                while running.load(Ordering::Relaxed) {
                    let from = epoch.elapsed().as_secs_f64();
                    let started_in = generation.load(Ordering::Relaxed);
                    let secs = 3600;
                    let mut child = spawn_tied(
                        in_ns(&wrk_ns, "wrk")
                            .args(["-t1", &format!("-c{conns}"), &format!("-d{secs}s")])
                            .args(["--latency", "--timeout", "3s", "-s"])
                            .arg(&script)
                            .arg(format!("http://{}/", vip(lb)))
                            .stdout(Stdio::piped())
                            .stderr(Stdio::null()),
                        libc::SIGKILL,
                    )
                    .context("running wrk")?;
                    // Stopped early, wrk (SIGINT) still prints what it measured.
                    while child.try_wait()?.is_none() {
                        if !running.load(Ordering::Relaxed)
                            || generation.load(Ordering::Relaxed) != started_in
                        {
                            // SAFETY: our child, not yet reaped.
                            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let out = child.wait_with_output().context("wrk's output")?;
                    let mut seg = parse_wrk(&String::from_utf8_lossy(&out.stdout));
                    seg.lb = lb;
                    seg.from = from;
                    seg.to = epoch.elapsed().as_secs_f64();
                    let short =
                        seg.to - seg.from < 1.0 && generation.load(Ordering::Relaxed) == started_in;
                    if let Ok(mut w) = wrk.lock() {
                        w.push(seg);
                    }
                    if short {
                        // wrk ended by itself at once (it could not connect, say): its
                        // segment is recorded (no requests: nothing succeeded); wait a
                        // moment rather than spin.
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
                Ok(())
            }));
            let (running, curl) = (Arc::clone(&clients.running), Arc::clone(&clients.curl));
            let period = Duration::from_secs_f64(1.0 / f64::from(c.curl_per_s.max(1)));
            clients.threads.push(
                spawn_in_netns(ns, move || -> Result<()> {
                    let mut k = lb * 85;
                    let mut next = Instant::now();
                    while running.load(Ordering::Relaxed) {
                        next += period;
                        k += 1;
                        let t = epoch.elapsed().as_secs_f64();
                        let out = Command::new("curl")
                            .args(["-s", "-o", "/dev/null", "--max-time", "5"])
                            .args(["-w", "%{http_code} %{time_total}"])
                            .arg("--interface")
                            .arg(client_source(k).to_string())
                            .arg(format!("http://{}/", vip(lb)))
                            .stderr(Stdio::null())
                            .output()
                            .context("running curl")?;
                        let (code, seconds) =
                            parse_curl(&String::from_utf8_lossy(&out.stdout)).unwrap_or((0, 0.0));
                        if let Ok(mut c) = curl.lock() {
                            c.push(CurlRecord {
                                t,
                                lb,
                                code,
                                seconds,
                            });
                        }
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    }
                    Ok(())
                })?
                .join_handle(),
            );
        }
        Ok(clients)
    }

    /// Ends every wrk segment now (the next begins at once).
    pub fn cut(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops the loops after their current request or segment.
    pub fn stop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A spawned thread's handle, flattening `spawn_in_netns`'s nested result.
trait Flatten {
    fn join_handle(self) -> JoinHandle<Result<()>>;
}

impl Flatten for JoinHandle<Result<Result<()>>> {
    fn join_handle(self) -> JoinHandle<Result<()>> {
        std::thread::spawn(move || match self.join() {
            Ok(r) => r.and_then(|r| r),
            Err(_) => anyhow::bail!("a curl loop panicked"),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn wrk_report_parsed() {
        let text = "Running 10s test @ http://198.18.10.1/\n  1 threads and 2 connections\n\
          Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   412.33us  100.12us   2.10ms   90.00%\n\
          Latency Distribution\n     50%  398.00us\n     75%  450.00us\n     90%  520.00us\n     99%    1.20ms\n\
          500 requests in 10.00s, 120.00KB read\n  Socket errors: connect 1, read 2, write 0, timeout 3\n\
          Non-2xx or 3xx responses: 4\nRequests/sec:     50.00\n";
        let s = parse_wrk(text);
        assert_eq!(s.requests, 500);
        assert_eq!(s.socket_errors, 3);
        assert_eq!(s.timeouts, 3);
        assert_eq!(s.attempted_and_ok(), (503, 493));
        assert_eq!(s.non_2xx, 4);
        assert!((s.p50.unwrap() - 398e-6).abs() < 1e-12);
        assert!((s.p99.unwrap() - 1.2e-3).abs() < 1e-12);
    }

    #[test]
    fn curl_line_parsed() {
        assert_eq!(parse_curl("200 0.001234"), Some((200, 0.001234)));
        assert_eq!(parse_curl("000 5.000"), Some((0, 5.0)));
        assert_eq!(parse_curl(""), None);
    }
}
