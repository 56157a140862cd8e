//! Why a frame is refused, and the sampled record of one refusal.
//!
//! Every drop and every shadow or canary would-drop is counted under exactly one
//! [`DropReason`], per rule (`DROP_REASONS`, a per-CPU array by rule slot, with one more
//! entry, [`NO_RULE`], for the refusals no rule decides). A budgeted sample of them reaches
//! user space as [`DropEvent`]s through the `DROP_EVENTS` ring buffer, which `limiter
//! monitor` reads. The reason codes are part of the ABI and of the metrics' `reason`
//! label: a code is never reused for another meaning; new reasons are appended.

/// One way a frame is refused (or would be, in shadow mode or outside a canary).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// The rule's aggregate limit, on a standalone rule (no fleet share).
    Aggregate = 0,
    /// The rule's per-source limit.
    PerSource = 1,
    /// The fleet granted this host a share of 0 for the rule, until the lease lapses.
    ShareClosed = 2,
    /// The rule's aggregate at this host's fleet share: the share is spent.
    ShareSpent = 3,
    /// A first fragment without its whole transport header (or IPv6 header chain).
    TinyFragment = 4,
    /// A later fragment whose first fragment did not pass here, for a rule that depends
    /// on ports.
    OrphanFragment = 5,
    /// A fragment overlapping the first fragment's headers, or a second first fragment
    /// that disagrees with the first.
    OverlappingFragment = 6,
    /// An IPv6 extension-header chain longer than the program walks.
    LongHeaderChain = 7,
    /// More VLAN tags than the program walks (no rule: the destination is unseen).
    DeepVlan = 8,
    /// A tunnel whose inner headers the outer first fragment does not hold (no rule).
    UnreadableTunnel = 9,
}

/// How many reasons there are: the length of each reason array.
pub const DROP_REASON_COUNT: usize = 10;

/// The `DROP_REASONS` entry of refusals that no rule decides (deep VLAN stacks,
/// unreadable tunnels): the one after the last rule slot.
pub const NO_RULE: u32 = crate::abi::MAX_RULES;

impl DropReason {
    /// Every reason, in code order.
    pub const ALL: [DropReason; DROP_REASON_COUNT] = [
        DropReason::Aggregate,
        DropReason::PerSource,
        DropReason::ShareClosed,
        DropReason::ShareSpent,
        DropReason::TinyFragment,
        DropReason::OrphanFragment,
        DropReason::OverlappingFragment,
        DropReason::LongHeaderChain,
        DropReason::DeepVlan,
        DropReason::UnreadableTunnel,
    ];

    /// The reason of a code read from the kernel; `None` for a code this build does not
    /// know (a newer program's).
    pub const fn from_code(code: u32) -> Option<DropReason> {
        if (code as usize) < DROP_REASON_COUNT {
            Some(DropReason::ALL[code as usize])
        } else {
            None
        }
    }

    /// The metrics' `reason` label and the JSON name: snake_case, stable.
    pub const fn label(self) -> &'static str {
        match self {
            DropReason::Aggregate => "aggregate",
            DropReason::PerSource => "per_source",
            DropReason::ShareClosed => "share_closed",
            DropReason::ShareSpent => "share_spent",
            DropReason::TinyFragment => "tiny_fragment",
            DropReason::OrphanFragment => "orphan_fragment",
            DropReason::OverlappingFragment => "overlapping_fragment",
            DropReason::LongHeaderChain => "long_header_chain",
            DropReason::DeepVlan => "deep_vlan",
            DropReason::UnreadableTunnel => "unreadable_tunnel",
        }
    }

    /// What an operator reads (`limiter monitor`, `explain`).
    pub const fn describe(self) -> &'static str {
        match self {
            DropReason::Aggregate => "aggregate limit",
            DropReason::PerSource => "per-source limit",
            DropReason::ShareClosed => "fleet share closed",
            DropReason::ShareSpent => "fleet share spent",
            DropReason::TinyFragment => "tiny fragment",
            DropReason::OrphanFragment => "orphan fragment",
            DropReason::OverlappingFragment => "overlapping fragment",
            DropReason::LongHeaderChain => "long header chain",
            DropReason::DeepVlan => "deep VLAN stack",
            DropReason::UnreadableTunnel => "unreadable tunnel",
        }
    }
}

/// Frames each reason refused for one rule on one CPU (`DROP_REASONS[slot]`): dropped,
/// and passed as would-drops (shadow mode, or outside the rule's canary). Indexed by
/// `DropReason as usize`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReasonCounters {
    pub dropped_packets: [u64; DROP_REASON_COUNT],
    pub would_drop_packets: [u64; DROP_REASON_COUNT],
}

impl ReasonCounters {
    /// Adds another CPU's copy (wrapping, as the kernel's increments).
    pub fn accumulate(&mut self, other: &ReasonCounters) {
        for i in 0..DROP_REASON_COUNT {
            self.dropped_packets[i] =
                self.dropped_packets[i].wrapping_add(other.dropped_packets[i]);
            self.would_drop_packets[i] =
                self.would_drop_packets[i].wrapping_add(other.would_drop_packets[i]);
        }
    }

    /// The change since `earlier` (wrapping, as the counters).
    pub fn since(&self, earlier: &ReasonCounters) -> ReasonCounters {
        let mut d = ReasonCounters::default();
        for i in 0..DROP_REASON_COUNT {
            d.dropped_packets[i] = self.dropped_packets[i].wrapping_sub(earlier.dropped_packets[i]);
            d.would_drop_packets[i] =
                self.would_drop_packets[i].wrapping_sub(earlier.would_drop_packets[i]);
        }
        d
    }

    /// Dropped packets over every reason (a rule's `dropped_packets`, when every drop
    /// is counted under its reason).
    pub fn dropped_total(&self) -> u64 {
        self.dropped_packets
            .iter()
            .fold(0u64, |a, b| a.wrapping_add(*b))
    }

    /// Would-drop packets over every reason.
    pub fn would_drop_total(&self) -> u64 {
        self.would_drop_packets
            .iter()
            .fold(0u64, |a, b| a.wrapping_add(*b))
    }

    /// The reasons with a non-zero count: (reason, dropped, would-drop).
    pub fn nonzero(&self) -> impl Iterator<Item = (DropReason, u64, u64)> + '_ {
        DropReason::ALL.iter().filter_map(|r| {
            let i = *r as usize;
            let (d, w) = (self.dropped_packets[i], self.would_drop_packets[i]);
            (d != 0 || w != 0).then_some((*r, d, w))
        })
    }
}

/// [`DropEvent::verdict`]: the frame was dropped.
pub const EVENT_DROPPED: u32 = 0;
/// [`DropEvent::verdict`]: the frame passed, counted as a would-drop (shadow mode, or a
/// source outside the rule's canary).
pub const EVENT_WOULD_DROP: u32 = 1;

/// The most bytes of a frame one event carries (`MonitorConfig::snap_len` is at most
/// this).
pub const MAX_SNAP_LEN: usize = 128;

/// One sampled refusal, as written to the `DROP_EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropEvent {
    /// CLOCK_MONOTONIC ns (`bpf_ktime_get_ns`).
    pub time_ns: u64,
    /// The interface the frame came in on.
    pub ifindex: u32,
    /// Its receive queue.
    pub rx_queue: u32,
    /// The rule's slot ([`NO_RULE`] for reasons no rule decides) and the rule table's
    /// generation the frame was classified in (a slot is reused across reloads).
    pub slot: u32,
    pub generation: u32,
    /// [`DropReason`] code.
    pub reason: u32,
    /// [`EVENT_DROPPED`] or [`EVENT_WOULD_DROP`].
    pub verdict: u32,
    /// 4 or 6; 0 when the addresses were not read (deep VLAN stacks).
    pub family: u32,
    /// IP protocol of the classified header (the inner one when a tunnel is classified).
    pub proto: u32,
    /// Addresses (IPv4 in the first word, network order as in the frame).
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Ports, host order; 0 when the frame shows none (later fragments, ICMP).
    pub src_port: u16,
    pub dst_port: u16,
    /// Bytes of the whole frame.
    pub frame_len: u32,
    /// How many bytes of `data` are the frame's first bytes (≤ [`MAX_SNAP_LEN`]).
    pub snap_len: u32,
    /// Keeps `data` 8-byte aligned and the size a multiple of 8.
    pub _pad: u32,
    pub data: [u8; MAX_SNAP_LEN],
}

/// `MONITOR[0]`, written by the daemon: the sampling budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorConfig {
    /// Events each CPU may write per second; 0: sampling off.
    pub events_per_sec: u32,
    /// Bytes of each frame an event carries (≤ [`MAX_SNAP_LEN`]).
    pub snap_len: u32,
}

/// Per-CPU counters of the sampling (`MONITOR_COUNTS[0]`): nothing is lost silently.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct MonitorCounters {
    /// Events written to the ring buffer.
    pub sampled: u64,
    /// Refusals not sampled because this CPU's budget for the second was spent.
    pub skipped_budget: u64,
    /// Events lost because the ring buffer was full (a failed reserve).
    pub lost_full: u64,
}

/// Bounds the daemon enforces on [`MonitorConfig::events_per_sec`] (per CPU).
pub const MAX_EVENTS_PER_SEC: u32 = 100_000;

/// Bytes of the `DROP_EVENTS` ring buffer (a power of two, a multiple of the page size):
/// 1 MiB holds about 4,800 events (each 216 bytes and an 8-byte header), a reader that
/// wakes every 100 ms keeps up with ≈ 48,000 events per second, and the memory is
/// allocated once, whether anything reads or not.
pub const DROP_EVENTS_BYTES: u32 = 1 << 20;

/// [`MonitorState::pending`]: the current run refused a frame and stashed it for
/// sampling.
pub const PENDING_EVENT: u32 = 1;

/// The program's own per-CPU sampling state (`MONITOR_STATE[0]`): the current second's
/// budget, and the refusal this run stashed where the frame's headers were at hand (the
/// event itself is written where the frame's context is, after the verdict).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorState {
    /// The second (CLOCK_MONOTONIC) `used` counts in, read at the first refusal of each
    /// jiffy (`jiffy`): a flood over the budget costs no clock read per frame.
    pub second: u64,
    /// Events stashed in `second` on this CPU (a stash whose record the ring buffer then
    /// cannot take is counted here too: the budget bounds attempts).
    pub used: u32,
    /// [`PENDING_EVENT`] or 0.
    pub pending: u32,
    /// The stashed refusal: as the [`DropEvent`] fields of the same names.
    pub slot: u32,
    pub generation: u32,
    pub reason: u32,
    pub verdict: u32,
    pub family: u32,
    pub proto: u32,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    /// The low 32 bits of jiffies when `second` was read. A match 2^32 jiffies later
    /// (49 days at HZ = 1000) keeps a stale `second` only until the next jiffy.
    pub jiffy: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, made only of integers, no padding (asserted below).
    unsafe impl aya::Pod for super::ReasonCounters {}
    unsafe impl aya::Pod for super::DropEvent {}
    unsafe impl aya::Pod for super::MonitorConfig {}
    unsafe impl aya::Pod for super::MonitorCounters {}
    unsafe impl aya::Pod for super::MonitorState {}
}

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<ReasonCounters>() == 2 * 8 * DROP_REASON_COUNT);
    assert!(size_of::<DropEvent>() == 8 + 4 * 8 + 16 * 2 + 2 * 2 + 4 * 3 + MAX_SNAP_LEN);
    assert!(size_of::<DropEvent>().is_multiple_of(8));
    assert!(size_of::<MonitorConfig>() == 8);
    assert!(size_of::<MonitorCounters>() == 24);
    assert!(size_of::<MonitorState>() == 8 + 4 * 8 + 16 * 2 + 2 * 2 + 4);
    assert!(DROP_EVENTS_BYTES.is_power_of_two() && DROP_EVENTS_BYTES.is_multiple_of(4096));
    assert!(DropReason::ALL.len() == DROP_REASON_COUNT);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_their_index_and_labels_are_distinct() {
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i);
            assert_eq!(DropReason::from_code(i as u32), Some(*reason));
        }
        assert_eq!(DropReason::from_code(DROP_REASON_COUNT as u32), None);
        let mut labels: std::vec::Vec<_> = DropReason::ALL.iter().map(|r| r.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), DROP_REASON_COUNT);
    }
}
