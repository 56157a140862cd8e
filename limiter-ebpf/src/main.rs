//! limiter's XDP program: parse -> classify -> meter -> verdict -> count.
//!
//! The one rule: a failure may make the limiter less accurate, never take traffic down.
//! What the program cannot match passes and is counted, and so does a frame it cannot
//! parse that no stack would deliver; the frames whose headers it cannot see whole but a
//! stack could deliver are refused or dropped (docs/when-things-fail.md, "Frames the
//! program cannot read"). It never returns XDP_ABORTED.
#![no_std]
#![no_main]
#![feature(core_intrinsics, asm_experimental_arch)]
#![allow(internal_features)]

mod classify;
mod decide;
mod maps;
mod meter;
mod monitor;
mod parse;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::generated::bpf_xdp_get_buff_len,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use limiter_common::{
    abi::{GlobalCounters, TunnelCounters, CONTROL_BYPASS, CONTROL_TUNNELS, MAX_HANDOFF_SLOTS},
    drop::{DropReason, NO_RULE},
};

use crate::{
    meter::Size,
    monitor::Frame,
    parse::{ParseError, Tunnels},
};

/// Multi-buffer aware (`xdp.frags`): attaches in native mode to interfaces whose MTU needs
/// more than one buffer per frame and meters the whole frame. The daemon uses it where
/// [`limiter_linear`] cannot attach, and in generic mode.
#[xdp(frags)]
#[inline(always)]
pub fn limiter(ctx: XdpContext) -> u32 {
    // SAFETY: the context pointer the kernel gave this run.
    let len = || unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    let v = verdict(
        try_limiter(
            ctx.data(),
            ctx.data_end(),
            || Size {
                packets: 1,
                bytes: len(),
            },
            || xdp_ifindex(&ctx),
        ),
        || xdp_frame(&ctx, len()),
    );
    hand_over(&ctx, v, &maps::HANDOFF_MULTI)
}

/// The same program for single-buffer frames: loaded without `frags`, so the kernel never
/// hands it a multi-buffer frame (it refuses to attach, or to raise the MTU, where one
/// could arrive) and the frame length is the linear length, without the helper call that
/// [`limiter`] needs (≈ 9 ns, a tenth of the program).
#[xdp]
#[inline(always)]
pub fn limiter_linear(ctx: XdpContext) -> u32 {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let v = verdict(
        try_limiter(
            data,
            data_end,
            || Size {
                packets: 1,
                bytes: (data_end - data) as u64,
            },
            || xdp_ifindex(&ctx),
        ),
        || xdp_frame(&ctx, (ctx.data_end() - ctx.data()) as u64),
    );
    hand_over(&ctx, v, &maps::HANDOFF_LINEAR)
}

/// The single-buffer build as a component of a libxdp dispatcher (`xdp_share =
/// "libxdp"`), loaded as an freplace program over one of the dispatcher's slots. The
/// dispatcher hands what it passes to the next component, so it has no handoff of its own
/// (the two ways of sharing exclude each other), and the kernel refuses an freplace
/// program that uses the XDP builds' program arrays.
#[xdp]
#[inline(always)]
pub fn limiter_libxdp(ctx: XdpContext) -> u32 {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    verdict(
        try_limiter(
            data,
            data_end,
            || Size {
                packets: 1,
                bytes: (data_end - data) as u64,
            },
            || xdp_ifindex(&ctx),
        ),
        || xdp_frame(&ctx, (ctx.data_end() - ctx.data()) as u64),
    )
}

/// An XDP frame, for its sampled event (read only for a refusal).
#[inline(always)]
fn xdp_frame(ctx: &XdpContext, len: u64) -> Frame {
    Frame {
        ifindex: xdp_ifindex(ctx),
        // SAFETY: the context pointer the kernel gave this run.
        rx_queue: unsafe { (*ctx.ctx).rx_queue_index },
        len,
        // Read again: the parser's bounds checks were on its own copies.
        data: ctx.data(),
        data_end: ctx.data_end(),
    }
}

/// The interface the frame came in on (its tunnels: `TUNNELS`).
#[inline(always)]
fn xdp_ifindex(ctx: &XdpContext) -> u32 {
    // SAFETY: the context pointer the kernel gave this run.
    unsafe { (*ctx.ctx).ingress_ifindex }
}

/// A frame the limiter passes goes to the next program when a handoff is configured
/// (`HANDOFF.slots > 0`): a tail call into each configured slot of `array` in turn. A
/// successful tail call does not return. When every slot is empty (the next program was
/// removed, or not installed yet), the frame passes to the stack anyway and is counted:
/// a missing next program may cost the LB's work, never the traffic.
#[inline(always)]
fn hand_over<const N: usize>(
    ctx: &XdpContext,
    verdict: u32,
    array: &aya_ebpf::btf_maps::ProgramArray<N>,
) -> u32 {
    if verdict != xdp_action::XDP_PASS {
        return verdict;
    }
    let Some(handoff) = maps::HANDOFF.get(0) else {
        return verdict;
    };
    let (first, slots) = (handoff.first, handoff.slots);
    if slots == 0 {
        return verdict;
    }
    for i in 0..MAX_HANDOFF_SLOTS {
        if i >= slots {
            break;
        }
        // SAFETY: ctx is this run's context; on success control never comes back.
        unsafe { array.tail_call(ctx, first.wrapping_add(i)) };
    }
    if let Some(c) = maps::HANDOFF_COUNTS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        unsafe { (*c).missing = (*c).missing.wrapping_add(1) };
    }
    verdict
}

/// Headers the parser may need, pulled into the linear part of a socket buffer whose
/// driver left them in fragments: Ethernet, two VLAN tags, IPv6 with some extension
/// headers, TCP (IPv4 with options and TCP: 102 bytes), and a tunnel's outer headers
/// before them (IPv4 with options, GRE with every optional word, then IPv4 with options
/// and TCP: 178 bytes).
const TC_PULL_LEN: u32 = 192;

/// The same program at TC ingress, for frames that reach the host as socket buffers
/// (veth fed by the stack, virtual NICs without native XDP): at TC they are metered
/// where they are, while any XDP program there makes the kernel copy each one into a page
/// first (veth's, and generic mode's, emulation of XDP). One run sees one socket buffer,
/// which GRO may have built from several packets: they are metered, counted and passed
/// or dropped together (`gso_segs` packets, the buffer's length in bytes).
#[classifier]
#[inline(always)]
pub fn limiter_tc(ctx: TcContext) -> i32 {
    let len = ctx.len();
    let want = len.min(TC_PULL_LEN);
    if ((ctx.data_end() - ctx.data()) as u32) < want {
        // Best effort: if it fails, the parser finds the headers truncated (malformed,
        // passed and counted).
        let _ = ctx.pull_data(want);
    }
    // Read where a rule meters, as the multi-buffer build's length: nothing about the
    // socket buffer is carried through the parser and the classifier.
    let size = || Size {
        // SAFETY: the context pointer the kernel gave this run.
        packets: u64::from(unsafe { (*ctx.skb.skb).gso_segs }.max(1)),
        bytes: u64::from(ctx.len()),
    };
    // SAFETY: the context pointer the kernel gave this run; at ingress, the device is the
    // one the frame came in on.
    let ifindex = || unsafe { (*ctx.skb.skb).ifindex };
    let frame = || Frame {
        // SAFETY: as `ifindex`.
        ifindex: unsafe { (*ctx.skb.skb).ifindex },
        // SAFETY: as `ifindex`.
        rx_queue: unsafe { (*ctx.skb.skb).queue_mapping },
        len: u64::from(ctx.len()),
        data: ctx.data(),
        data_end: ctx.data_end(),
    };
    match verdict(
        try_limiter(ctx.data(), ctx.data_end(), size, ifindex),
        frame,
    ) {
        xdp_action::XDP_DROP => TC_ACT_SHOT as i32,
        // Not ours to decide: the next program at this hook, if any, else the stack.
        _ => TC_ACT_UNSPEC,
    }
}

/// The XDP action of a run's result; a refusal (`monitor::REFUSED`) is sampled first,
/// when it was stashed (`frame` is read only then).
#[inline(always)]
fn verdict(result: Result<u32, ()>, frame: impl FnOnce() -> Frame) -> u32 {
    match result {
        Ok(result) => {
            if result & monitor::REFUSED != 0 {
                monitor::sample(frame);
            }
            result & monitor::ACTION_MASK
        }
        // Only a missing map entry gets here (the maps are fixed-size arrays, so it
        // cannot happen): pass.
        Err(()) => xdp_action::XDP_PASS,
    }
}

#[inline(always)]
fn try_limiter(
    data: usize,
    data_end: usize,
    size: impl Fn() -> Size,
    ifindex: impl FnOnce() -> u32,
) -> Result<u32, ()> {
    // A missing entry cannot happen (a fixed-size array); it passes here rather than as
    // an `Err`: on kernels that do not know an array lookup of a constant index always
    // finds its entry (6.1), that path reached the end of `limiter_tc` through LLVM's
    // merged exit, which read a register only the other paths set, and the verifier
    // refused the TC build.
    let Some(control) = maps::CONTROL.get(0) else {
        return Ok(xdp_action::XDP_PASS);
    };
    let flags = control.flags;
    if flags & CONTROL_BYPASS != 0 {
        return Ok(xdp_action::XDP_PASS);
    }
    let generation = control.generation;
    let tunnels = Tunnels {
        enabled: flags & CONTROL_TUNNELS != 0,
        // CONTROL_NEVER_SET, the top bit.
        zero: flags >> 31,
        // Copied out at once: the daemon may replace the entry meanwhile.
        // SAFETY: a hash map value pointer the lookup just returned.
        lookup: || {
            maps::TUNNELS
                .get_ptr(ifindex())
                .map(|p| unsafe { core::ptr::read_volatile(p) })
        },
    };
    // Inlined into each family's branch of the parser (see parse::parse).
    match parse::parse(
        data,
        data_end,
        tunnels,
        #[inline(always)]
        |pkt| decide::decide(generation, pkt, &size),
    ) {
        Ok(verdict) => verdict,
        Err(ParseError::NonIp) => {
            count_global(|g| &mut g.non_ip);
            Ok(xdp_action::XDP_PASS)
        }
        Err(ParseError::Malformed) => {
            count_global(|g| &mut g.malformed);
            Ok(xdp_action::XDP_PASS)
        }
        Err(ParseError::DeepVlan) => {
            decide::count_headers(|h| &mut h.deep_vlan_stacks);
            Ok(refused_without_rule(generation, DropReason::DeepVlan, size))
        }
        Err(ParseError::UnreadableTunnel) => {
            count_tunnels(|t| &mut t.unreadable);
            Ok(refused_without_rule(
                generation,
                DropReason::UnreadableTunnel,
                size,
            ))
        }
    }
}

/// A frame dropped before any rule could see it (its destination is unread): counted
/// under `NO_RULE`, and stashed for sampling without addresses (family 0).
#[inline(always)]
fn refused_without_rule(generation: u32, reason: DropReason, size: impl Fn() -> Size) -> u32 {
    monitor::count_reason(NO_RULE, reason as u32, false, size().packets);
    let result = monitor::refused(xdp_action::XDP_DROP, reason as u32);
    let none = [0; 4];
    monitor::stash(
        generation,
        NO_RULE,
        result,
        &monitor::Headers {
            family: 0,
            proto: 0,
            src: &none,
            dst: &none,
            dst_port: 0,
        },
    );
    result
}

/// Increments one tunnel counter on this CPU.
#[inline(always)]
pub(crate) fn count_tunnels(field: impl FnOnce(&mut TunnelCounters) -> &mut u64) {
    if let Some(t) = maps::TUNNEL_COUNTS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        let counter = field(unsafe { &mut *t });
        *counter = counter.wrapping_add(1);
    }
}

/// Increments one program-wide counter on this CPU.
#[inline(always)]
pub(crate) fn count_global(field: impl FnOnce(&mut GlobalCounters) -> &mut u64) {
    if let Some(g) = maps::GLOBAL_COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        let counter = field(unsafe { &mut *g });
        *counter = counter.wrapping_add(1);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
