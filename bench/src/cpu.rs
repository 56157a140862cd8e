//! Machine-wide CPU time from /proc/stat: every CPU, every kind of busy time (user,
//! system, hard and soft interrupts), so the softirq work of the receive path counts.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

/// A reading of the aggregate `cpu` line.
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    /// user + nice + system + irq + softirq, in clock ticks. Steal (time the hypervisor
    /// gave to someone else) and idle/iowait are not busy time.
    busy_ticks: u64,
    at: Instant,
}

/// Busy CPU over an interval, in CPU-seconds per second (2.0 = both CPUs of two busy).
#[derive(Clone, Copy, Debug)]
pub struct Busy {
    pub cpu_seconds: f64,
    pub wall: Duration,
}

impl Busy {
    pub fn load(&self) -> f64 {
        self.cpu_seconds / self.wall.as_secs_f64().max(1e-9)
    }
}

fn ticks_per_second() -> Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ensure!(hz > 0, "sysconf(_SC_CLK_TCK) returned {hz}");
    Ok(hz as f64)
}

impl CpuSample {
    pub fn read() -> Result<CpuSample> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = text
            .lines()
            .find(|l| l.starts_with("cpu "))
            .context("/proc/stat has no aggregate cpu line")?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("parsing /proc/stat: {line}"))?;
        ensure!(fields.len() >= 7, "short /proc/stat cpu line: {line}");
        // user nice system idle iowait irq softirq [steal guest guest_nice]
        let busy_ticks = fields[0] + fields[1] + fields[2] + fields[5] + fields[6];
        Ok(CpuSample {
            busy_ticks,
            at: Instant::now(),
        })
    }

    /// Busy time from `before` to `self`.
    pub fn since(&self, before: &CpuSample) -> Result<Busy> {
        let ticks = self.busy_ticks.saturating_sub(before.busy_ticks);
        Ok(Busy {
            cpu_seconds: ticks as f64 / ticks_per_second()?,
            wall: self.at.saturating_duration_since(before.at),
        })
    }
}

/// CPU time of this process (all its threads, the senders included, with the softirq
/// work the kernel did in their context) plus the `ksoftirqd` threads: the work the
/// measurement itself caused, whatever else the machine runs. Read from
/// `/proc/…/schedstat` (the scheduler's runtime in ns), not sampled by the tick.
#[derive(Clone, Copy, Debug)]
pub struct OwnSample {
    ns: u64,
    /// The same tasks, tick-sampled (utime + stime), to compare with /proc/stat.
    ticks: u64,
}

impl OwnSample {
    /// `softirqd`: from [`softirqd_pids`]. Threads of this process that exit between two
    /// samples take their time with them: sample while the senders run.
    pub fn read(softirqd: &[u32]) -> Result<OwnSample> {
        let mut sample = OwnSample { ns: 0, ticks: 0 };
        let mut add = |dir: &str| -> Result<()> {
            sample.ns += runtime_ns(&format!("{dir}/schedstat"))?;
            sample.ticks += task_ticks(&format!("{dir}/stat"))?;
            Ok(())
        };
        for entry in std::fs::read_dir("/proc/self/task").context("listing /proc/self/task")? {
            let entry = entry.context("listing /proc/self/task")?;
            // A thread that just exited vanishes between listing and reading: skip it.
            let dir = entry.path();
            if let Some(dir) = dir.to_str() {
                if let Err(e) = add(dir) {
                    if dir_exists(dir) {
                        return Err(e);
                    }
                }
            }
        }
        for pid in softirqd {
            add(&format!("/proc/{pid}"))?;
        }
        Ok(sample)
    }

    /// CPU-seconds from `before` to `self`.
    pub fn since(&self, before: &OwnSample) -> f64 {
        self.ns.saturating_sub(before.ns) as f64 / 1e9
    }

    /// CPU-seconds from `before` to `self`, tick-sampled.
    pub fn ticks_since(&self, before: &OwnSample) -> Result<f64> {
        Ok(self.ticks.saturating_sub(before.ticks) as f64 / ticks_per_second()?)
    }
}

fn dir_exists(dir: &str) -> bool {
    std::path::Path::new(dir).exists()
}

/// The first field of /proc/…/schedstat: time on the CPU, ns.
fn runtime_ns(path: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.split_whitespace()
        .next()
        .with_context(|| format!("empty {path}"))?
        .parse()
        .with_context(|| format!("parsing {path}: {text}"))
}

/// utime + stime of one /proc/…/stat, in clock ticks.
fn task_ticks(path: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // The command name is in parentheses and may contain anything; fields follow it.
    let (_, rest) = text
        .rsplit_once(')')
        .with_context(|| format!("unexpected {path}: {text}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .with_context(|| format!("short {path}: {text}"))?
            .parse()
            .with_context(|| format!("parsing {path}: {text}"))
    };
    // Fields 14 and 15 of the line; the first after ')' is field 3.
    Ok(field(11)? + field(12)?)
}

/// Process ids of the `ksoftirqd/N` threads.
pub fn softirqd_pids() -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("listing /proc")? {
        let entry = entry.context("listing /proc")?;
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.starts_with("ksoftirqd/") {
            pids.push(pid);
        }
    }
    ensure!(!pids.is_empty(), "no ksoftirqd threads found in /proc");
    Ok(pids)
}

/// Busy load while nothing is sent, over `window`.
pub fn idle_load(window: Duration) -> Result<f64> {
    let before = CpuSample::read()?;
    std::thread::sleep(window);
    Ok(CpuSample::read()?.since(&before)?.load())
}
