//! limiter's XDP program: parse -> classify -> meter -> verdict -> count.
//!
//! The one rule: a failure may make the limiter less accurate, never take traffic down.
//! Anything the program cannot parse or match passes and is counted; it never returns
//! XDP_ABORTED.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod classify;
mod maps;
mod meter;
mod parse;

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_get_buff_len, macros::xdp,
    programs::XdpContext,
};
use limiter_common::abi::{GlobalCounters, CONTROL_BYPASS};

use crate::parse::ParseError;

/// `frags`: multi-buffer aware, so it attaches in native mode to jumbo-MTU interfaces and
/// meters the whole frame, not just its first buffer.
#[xdp(frags)]
pub fn limiter(ctx: XdpContext) -> u32 {
    match try_limiter(&ctx) {
        Ok(verdict) => verdict,
        // Only a missing map entry gets here (the maps are fixed-size arrays, so it
        // cannot happen): pass.
        Err(()) => xdp_action::XDP_PASS,
    }
}

#[inline(always)]
fn try_limiter(ctx: &XdpContext) -> Result<u32, ()> {
    let control = maps::CONTROL.get(0).ok_or(())?;
    if control.flags & CONTROL_BYPASS != 0 {
        return Ok(xdp_action::XDP_PASS);
    }
    let generation = control.generation;
    let pkt = match parse::parse(ctx) {
        Ok(pkt) => pkt,
        Err(ParseError::NonIp) => {
            count_global(|g| &mut g.non_ip);
            return Ok(xdp_action::XDP_PASS);
        }
        Err(ParseError::Malformed) => {
            count_global(|g| &mut g.malformed);
            return Ok(xdp_action::XDP_PASS);
        }
    };
    let Some(slot) = classify::classify(generation, &pkt) else {
        count_global(|g| &mut g.unmatched);
        return Ok(xdp_action::XDP_PASS);
    };
    // SAFETY: the context pointer the kernel gave this run.
    let frame_len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    meter::meter(generation, slot, &pkt, frame_len)
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
