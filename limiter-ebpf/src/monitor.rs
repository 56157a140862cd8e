//! Why frames are refused, and a budgeted sample of the refusals for `limiter monitor`.
//!
//! Everything here runs on the refusal path only. A refusal is counted under its reason
//! where it is decided ([`count_reason`]); where the frame's headers are at hand, it is
//! stashed in this CPU's `MONITOR_STATE` when sampling is on and this CPU's budget for
//! the second allows ([`stash`]); and after the verdict, where the frame's context is,
//! the stash becomes a `DROP_EVENTS` record ([`sample`]). A run's verdict carries
//! [`REFUSED`] and the reason above the XDP action, so the entry points know a would-drop
//! (which passes) from a pass without another map lookup on the passed frames' path.
//!
//! With sampling off, a refusal reads the sampling config twice (a plain array, whose
//! lookup every kernel inlines) and nothing else here. A flood over the budget pays on
//! top of that the per-CPU state's lookups and the skipped counter, and a clock read once
//! per jiffy and CPU, not per frame: the budget's
//! second is read on the jiffy the kernel keeps, as the meter's tick clock is. (Saying
//! "stashed" in the run's result instead of in `MONITOR_STATE` would save the second
//! lookup, but the result's two values kept the verifier's states apart after every
//! refusal: 369 k instructions processed instead of 177 k, for no time measured. Checking
//! the budget in [`sample`] instead, after an unconditional stash, cost 240 k here and
//! 67-69 ns per refusal over the budget, against 177 k and 49-51 ns.)

use aya_ebpf::helpers::{bpf_ktime_get_ns, generated::bpf_jiffies64};
use limiter_common::{
    abi::AddrWords,
    drop::{
        MonitorCounters, MonitorState, EVENT_DROPPED, EVENT_WOULD_DROP, MAX_SNAP_LEN, PENDING_EVENT,
    },
};

use crate::maps;

/// In a run's result: the frame was refused (dropped, or passed as a would-drop).
pub const REFUSED: u32 = 1 << 16;
/// In a run's result: where the reason code sits.
pub const REASON_SHIFT: u32 = 8;
/// The XDP action in a run's result.
pub const ACTION_MASK: u32 = 0xff;

const NS_PER_SEC: u64 = 1_000_000_000;

/// A refusal's result: `action` (XDP_DROP, or XDP_PASS for a would-drop), the reason
/// and [`REFUSED`].
#[inline(always)]
pub fn refused(action: u32, reason: u32) -> u32 {
    action | REFUSED | (reason << REASON_SHIFT)
}

/// Counts one refusal of `packets` under `slot` (a rule slot, or `NO_RULE`) and `reason`
/// (a constant at every call site: the counter's offset is known to the verifier).
#[inline(always)]
pub fn count_reason(slot: u32, reason: u32, would_drop: bool, packets: u64) {
    let Some(r) = maps::DROP_REASONS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: a per-CPU array value, touched only by this CPU's program run.
    let r = unsafe { &mut *r };
    let counters = if would_drop {
        &mut r.would_drop_packets
    } else {
        &mut r.dropped_packets
    };
    if let Some(c) = counters.get_mut(reason as usize) {
        *c = c.wrapping_add(packets);
    }
}

/// What an event says of the frame's headers.
pub struct Headers<'a> {
    pub family: u32,
    pub proto: u32,
    pub src: &'a AddrWords,
    pub dst: &'a AddrWords,
    pub dst_port: u16,
}

/// Keeps a refusal (`result`, as [`refused`] made it) for [`sample`] when sampling is on
/// and this CPU's budget for the second allows. While sampling is off this one array
/// lookup is all it costs; over the budget, the refusal is counted as skipped before
/// anything is copied.
#[inline(always)]
pub fn stash(generation: u32, slot: u32, result: u32, headers: &Headers) {
    let Some(config) = maps::MONITOR.get(0) else {
        return;
    };
    let budget = config.events_per_sec;
    if budget == 0 {
        return;
    }
    let Some(state) = maps::MONITOR_STATE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU array value, touched only by this CPU's program run.
    let state = unsafe { &mut *state };
    if !take_budget(state, budget) {
        count_monitor(|c| &mut c.skipped_budget);
        return;
    }
    state.pending = PENDING_EVENT;
    state.slot = slot;
    state.generation = generation;
    state.reason = (result >> REASON_SHIFT) & ACTION_MASK;
    state.verdict = if result & ACTION_MASK == aya_ebpf::bindings::xdp_action::XDP_DROP {
        EVENT_DROPPED
    } else {
        EVENT_WOULD_DROP
    };
    state.family = headers.family;
    state.proto = headers.proto;
    state.src = *headers.src;
    state.dst = *headers.dst;
    state.src_port = 0;
    state.dst_port = headers.dst_port;
}

/// One event of this CPU's budget for the current second, if any is left. The second is
/// read (`bpf_ktime_get_ns`, ≈ 35 ns on a VM) at the first refusal of each jiffy only:
/// `bpf_jiffies64` is a load once the verifier has inlined it.
#[inline(always)]
fn take_budget(state: &mut MonitorState, budget: u32) -> bool {
    // SAFETY: a helper without arguments. The low 32 bits: see `MonitorState::jiffy`.
    let jiffy = unsafe { bpf_jiffies64() } as u32;
    if state.jiffy != jiffy {
        state.jiffy = jiffy;
        // SAFETY: a helper without arguments.
        let second = unsafe { bpf_ktime_get_ns() } / NS_PER_SEC;
        if state.second != second {
            state.second = second;
            state.used = 0;
        }
    }
    if state.used >= budget {
        return false;
    }
    state.used += 1;
    true
}

/// Where the frame is, for an event.
pub struct Frame {
    pub ifindex: u32,
    pub rx_queue: u32,
    /// Bytes of the whole frame.
    pub len: u64,
    /// Its linear part: the snap is copied from there.
    pub data: usize,
    pub data_end: usize,
}

/// Writes the refusal [`stash`] kept, if this run kept one, as a `DROP_EVENTS` record.
/// Never changes the verdict.
#[inline(always)]
pub fn sample(frame: impl FnOnce() -> Frame) {
    // Sampling off, the config's array is all a refusal reads here: its lookup is inlined
    // on every kernel, the per-CPU state's is a helper call before 6.10. (A stash left
    // by a run that saw sampling switched off between `stash` and here is overwritten by
    // the next stash, or written, stamped late, by the next sample that finds it.)
    let Some(config) = maps::MONITOR.get(0) else {
        return;
    };
    if config.events_per_sec == 0 {
        return;
    }
    // The stash keeps the headers, not the config: the snap length is read here.
    let snap_len = config.snap_len;
    let Some(state) = maps::MONITOR_STATE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU array value, touched only by this CPU's program run.
    let state = unsafe { &mut *state };
    if state.pending == 0 {
        return;
    }
    state.pending = 0;
    let Some(mut entry) = maps::DROP_EVENTS.reserve(0) else {
        count_monitor(|c| &mut c.lost_full);
        return;
    };
    // SAFETY: a helper without arguments. Read only for the events written (at most the
    // budget per second and CPU): the event's time is precise.
    let now = unsafe { bpf_ktime_get_ns() };
    let frame = frame();
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field before it is submitted.
    unsafe {
        (*event).time_ns = now;
        (*event).ifindex = frame.ifindex;
        (*event).rx_queue = frame.rx_queue;
        (*event).slot = state.slot;
        (*event).generation = state.generation;
        (*event).reason = state.reason;
        (*event).verdict = state.verdict;
        (*event).family = state.family;
        (*event).proto = state.proto;
        (*event).src = state.src;
        (*event).dst = state.dst;
        (*event).src_port = state.src_port;
        (*event).dst_port = state.dst_port;
        (*event).frame_len = frame.len as u32;
        (*event)._pad = 0;
        (*event).snap_len = copy_snap(
            core::ptr::addr_of_mut!((*event).data).cast(),
            frame.data,
            frame.data_end,
            snap_len,
        );
    }
    entry.submit(0);
    count_monitor(|c| &mut c.sampled);
}

/// Copies the frame's first bytes from its linear part, in whole 8-byte words: at most
/// `want` and `MAX_SNAP_LEN`, rounded down to a word (a frame's last bytes past its last
/// whole word are left out). A bounded copy rather than `bpf_xdp_load_bytes` (Linux
/// 5.18): the single-buffer builds run on 5.12; and words, not bytes, because each
/// iteration costs the verifier the same. Returns how many bytes it copied.
#[inline(always)]
unsafe fn copy_snap(out: *mut u8, data: usize, data_end: usize, want: u32) -> u32 {
    let want = (want as usize).min(MAX_SNAP_LEN);
    let mut copied = 0;
    for i in 0..MAX_SNAP_LEN / 8 {
        let at = i * 8;
        if at + 8 > want || data + at + 8 > data_end {
            break;
        }
        // SAFETY: bounds-checked against data_end just above; unaligned packet loads are
        // what the parser does too; `at + 8 <= MAX_SNAP_LEN`, inside `out`.
        unsafe {
            let word = core::ptr::read_unaligned((data + at) as *const u64);
            core::ptr::write_unaligned(out.add(at) as *mut u64, word);
        }
        copied = at + 8;
    }
    copied as u32
}

/// Increments one sampling counter on this CPU.
#[inline(always)]
fn count_monitor(field: impl FnOnce(&mut MonitorCounters) -> &mut u64) {
    if let Some(c) = maps::MONITOR_COUNTS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        let counter = field(unsafe { &mut *c });
        *counter = counter.wrapping_add(1);
    }
}
