//! `limiter monitor` and `limiter top --sources`: the sampled refusals the program writes
//! to the `DROP_EVENTS` ring buffer, read from the pins (no daemon needed).
//!
//! The pure parts: [`event`] decodes a record (and reads ports, TCP flags and fragments
//! from the snapped bytes), [`format`] makes a line or a JSON object of it, [`pcapng`]
//! a packet of a capture file, [`filter`] chooses, [`sources`] ranks the sources. This
//! file is the I/O: the pinned maps, the names of rules and interfaces, the clocks.
//!
//! A BPF ring buffer has one consumer position: two readers at once (two `monitor`s, or
//! `monitor` and `top --sources`) split the events between them, each seeing some.
//! [`ReaderClaim`] tells the second one so.

pub mod event;
pub mod filter;
pub mod format;
pub mod pcapng;
pub mod sources;

use std::{
    collections::HashMap,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Array, Map, MapData, MapError, MapInfo, PerCpuArray, RingBuf};
use limiter_common::{
    abi::{
        map_name,
        map_name::{DROP_EVENTS, MONITOR, MONITOR_COUNTS},
        rule_index, RuleConfig, CONTROL_BYPASS, MAX_RULES, RULE_IN_USE,
    },
    drop::{DropEvent, MonitorConfig, MonitorCounters},
};

use self::format::RuleName;
use crate::error::Error;

/// `--json`'s fields, in the order docs/operations.md lists them.
pub const JSON_FIELDS: [&str; 21] = [
    "time",
    "monotonic_ns",
    "verdict",
    "reason",
    "reason_code",
    "rule",
    "rule_slot",
    "interface",
    "ifindex",
    "rx_queue",
    "family",
    "proto",
    "proto_name",
    "src",
    "dst",
    "src_port",
    "dst_port",
    "tcp_flags",
    "fragment",
    "frame_len",
    "snap_len",
];

fn map_err(what: String) -> impl FnOnce(MapError) -> Error {
    move |source| Error::Map { what, source }
}

fn open_pinned(pin_dir: &Path, name: &str) -> Result<Map, Error> {
    let path = pin_dir.join(name);
    if !path.exists() {
        if !pin_dir.join(map_name::CONTROL).exists() {
            return Err(Error::NotPinned(pin_dir.to_path_buf()));
        }
        return Err(Error::Io {
            what: format!(
                "opening {}: the running program predates sampled drop events (a daemon of \
                 this version pins it at start)",
                path.display()
            ),
            source: std::io::ErrorKind::NotFound.into(),
        });
    }
    let data = MapData::from_pin(&path)
        .map_err(map_err(format!("opening pinned map {}", path.display())))?;
    Map::from_map_data(data).map_err(map_err(format!("opening {}", path.display())))
}

/// The ring buffer of sampled refusals, and the maps that say what it holds.
pub struct Reader {
    ring: RingBuf<MapData>,
    counts: PerCpuArray<MapData, MonitorCounters>,
    config: Array<MapData, MonitorConfig>,
    control: Array<MapData, limiter_common::abi::Control>,
    rules: Array<MapData, RuleConfig>,
    /// Rule names by (generation, slot), forgotten when the live generation changes.
    names: HashMap<(u32, u32), RuleName>,
    names_generation: Option<u32>,
}

impl Reader {
    pub fn open(pin_dir: &Path) -> Result<Reader, Error> {
        let typed = |name: &'static str| -> Result<Map, Error> { open_pinned(pin_dir, name) };
        let ring = RingBuf::try_from(typed(DROP_EVENTS)?)
            .map_err(map_err(format!("opening {DROP_EVENTS}")))?;
        Ok(Reader {
            ring,
            counts: PerCpuArray::try_from(typed(MONITOR_COUNTS)?)
                .map_err(map_err(format!("opening {MONITOR_COUNTS}")))?,
            config: Array::try_from(typed(MONITOR)?)
                .map_err(map_err(format!("opening {MONITOR}")))?,
            control: Array::try_from(typed(map_name::CONTROL)?)
                .map_err(map_err(format!("opening {}", map_name::CONTROL)))?,
            rules: Array::try_from(typed(map_name::RULES)?)
                .map_err(map_err(format!("opening {}", map_name::RULES)))?,
            names: HashMap::new(),
            names_generation: None,
        })
    }

    /// Waits up to `timeout` for events, then hands each one waiting to `each`; returns
    /// how many records were read (records of another size are skipped).
    pub fn poll(
        &mut self,
        timeout: Duration,
        mut each: impl FnMut(DropEvent),
    ) -> Result<usize, Error> {
        let mut pfd = libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Io {
                    what: format!("waiting on {DROP_EVENTS}"),
                    source: e,
                });
            }
        }
        let mut read = 0;
        while let Some(item) = self.ring.next() {
            read += 1;
            if let Some(raw) = event::parse_record(&item) {
                each(raw);
            }
        }
        Ok(read)
    }

    /// The sampling counters, summed over CPUs.
    pub fn counters(&self) -> Result<MonitorCounters, Error> {
        let per_cpu = self
            .counts
            .get(&0, 0)
            .map_err(map_err(format!("reading {MONITOR_COUNTS}")))?;
        Ok(per_cpu
            .iter()
            .fold(MonitorCounters::default(), |a, c| MonitorCounters {
                sampled: a.sampled.wrapping_add(c.sampled),
                skipped_budget: a.skipped_budget.wrapping_add(c.skipped_budget),
                lost_full: a.lost_full.wrapping_add(c.lost_full),
            }))
    }

    /// The sampling budget the daemon set.
    pub fn config(&self) -> Result<MonitorConfig, Error> {
        self.config
            .get(&0, 0)
            .map_err(map_err(format!("reading {MONITOR}")))
    }

    /// Whether the kill switch is on (nothing is dropped, nothing sampled).
    pub fn bypass(&self) -> Result<bool, Error> {
        let control = self
            .control
            .get(&0, 0)
            .map_err(map_err(format!("reading {}", map_name::CONTROL)))?;
        Ok(control.flags & CONTROL_BYPASS != 0)
    }

    /// The rule an event names: the `RULES` entry of its generation and slot. The
    /// previous generation stays readable until the next install, so an event from
    /// just before a reload still finds its rule; after two reloads the slot may hold
    /// another rule or none, and names are forgotten at each flip.
    pub fn rule_name(&mut self, slot_generation: Option<(u32, u32)>) -> RuleName {
        let Some((slot, generation)) = slot_generation else {
            return RuleName::None;
        };
        if slot >= MAX_RULES {
            return RuleName::Gone { slot };
        }
        let live = self.control.get(&0, 0).ok().map(|c| c.generation);
        if live != self.names_generation {
            self.names.clear();
            self.names_generation = live;
        }
        if let Some(name) = self.names.get(&(generation, slot)) {
            return name.clone();
        }
        let name = match self.rules.get(&rule_index(generation, slot), 0) {
            Ok(rule) if rule.flags & RULE_IN_USE != 0 => {
                RuleName::Named(String::from_utf8_lossy(rule.name_bytes()).into_owned())
            }
            _ => RuleName::Gone { slot },
        };
        self.names.insert((generation, slot), name.clone());
        name
    }
}

/// The name of interface `ifindex`, if it still has one.
pub fn interface_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// CLOCK_MONOTONIC ns now: the clock events are stamped with.
pub fn monotonic_ns() -> u64 {
    u64::try_from(clock_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0)
}

/// What to add to a CLOCK_MONOTONIC time to get the wall clock's, read once: a
/// capture's timestamps then keep their spacing even if the wall clock is stepped.
pub fn wall_offset_ns() -> i128 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}

/// One ring buffer reader at a time on this host: an abstract socket named after the
/// map's id, held while reading. A second reader is told, not refused (it may be wanted,
/// e.g. a capture running while an operator looks).
pub struct ReaderClaim {
    _socket: Option<std::os::unix::net::UnixListener>,
}

impl ReaderClaim {
    /// Claims the ring buffer under `pin_dir`; `Err` names the situation when another
    /// reader holds it (the caller warns and goes on).
    pub fn claim(pin_dir: &Path) -> Result<ReaderClaim, String> {
        use std::os::linux::net::SocketAddrExt as _;
        let path: PathBuf = pin_dir.join(DROP_EVENTS);
        let Ok(info) = MapInfo::from_pin(&path) else {
            return Ok(ReaderClaim { _socket: None });
        };
        let name = format!("limiter-monitor-{}", info.id());
        let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) else {
            return Ok(ReaderClaim { _socket: None });
        };
        match std::os::unix::net::UnixListener::bind_addr(&addr) {
            Ok(socket) => Ok(ReaderClaim {
                _socket: Some(socket),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(format!(
                "another `limiter monitor` or `limiter top --sources` reads {}: a ring buffer \
                 has one reader position, so the two split the events and each sees only \
                 some of them",
                path.display()
            )),
            Err(_) => Ok(ReaderClaim { _socket: None }),
        }
    }
}

/// `N sampled, M not sampled (budget), K lost (ring full)`: how much of the refusals
/// the events are, for the operator.
pub fn describe_counters(
    now: &MonitorCounters,
    start: &MonitorCounters,
    config: &MonitorConfig,
) -> String {
    let d = |a: u64, b: u64| a.wrapping_sub(b);
    let sampled = d(now.sampled, start.sampled);
    let skipped = d(now.skipped_budget, start.skipped_budget);
    let lost = d(now.lost_full, start.lost_full);
    let mut text = format!(
        "since start: {sampled} refusals sampled, {skipped} not sampled (over the budget of \
         {} events/s per CPU), {lost} lost (ring buffer full)",
        config.events_per_sec
    );
    if skipped + lost > 0 {
        text.push_str(": the events shown are a sample, not every refusal");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_say_when_the_events_are_a_sample() {
        let start = MonitorCounters {
            sampled: 10,
            skipped_budget: 5,
            lost_full: 0,
        };
        let config = MonitorConfig {
            events_per_sec: 100,
            snap_len: 128,
        };
        let same = describe_counters(&start, &start, &config);
        assert!(same.contains("0 refusals sampled"), "{same}");
        assert!(!same.contains("a sample"), "{same}");
        let later = MonitorCounters {
            sampled: 110,
            skipped_budget: 905,
            lost_full: 3,
        };
        let text = describe_counters(&later, &start, &config);
        assert!(text.contains("100 refusals sampled"), "{text}");
        assert!(text.contains("900 not sampled"), "{text}");
        assert!(text.contains("100 events/s per CPU"), "{text}");
        assert!(text.contains("3 lost (ring buffer full)"), "{text}");
        assert!(text.contains("a sample, not every refusal"), "{text}");
    }
}
