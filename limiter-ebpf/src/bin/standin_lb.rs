//! A stand-in load balancer, for tests and benchmarks of the tail-call handoff, never for
//! production. It is not the limiter's code path: it plays the programs the limiter is put
//! in front of.
//! - `standin_lb` / `standin_lb_v2`: "the LB". Each counts the frames it sees (its own
//!   slot of `LB_SEEN`, per CPU) and returns XDP_TX, a verdict neither the limiter
//!   (PASS/DROP) nor the stack gives, so a test tells whose verdict a frame got. `_v2`
//!   is the LB's upgrade (a replaced program must get the frames from then on).
//! - `standin_root`: Katran's root program in shared mode: it tail-calls the slots of
//!   its pinned array `ROOT_ARRAY` in order and passes the frame when all are empty.
//!
//! All three are plain XDP programs (no `frags`), as Katran's are.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{PerCpuArray, ProgramArray},
    macros::{btf_map, xdp},
    programs::XdpContext,
};

/// Frames seen, per CPU: slot 0 by `standin_lb`, slot 1 by `standin_lb_v2`, slot 2
/// frames `standin_root` passed because every slot of its array was empty.
#[btf_map]
static LB_SEEN: PerCpuArray<u64, 3> = PerCpuArray::new();

/// The root's slots (Katran's root array has a handful; 4 is enough here).
#[btf_map]
static ROOT_ARRAY: ProgramArray<4> = ProgramArray::new();

#[inline(always)]
fn count(slot: u32) {
    if let Some(n) = LB_SEEN.get_ptr_mut(slot) {
        // SAFETY: per-CPU value, only this CPU's run touches it.
        unsafe { *n += 1 };
    }
}

#[xdp]
pub fn standin_lb(_ctx: XdpContext) -> u32 {
    count(0);
    xdp_action::XDP_TX
}

#[xdp]
pub fn standin_lb_v2(_ctx: XdpContext) -> u32 {
    count(1);
    xdp_action::XDP_TX
}

#[xdp]
pub fn standin_root(ctx: XdpContext) -> u32 {
    for slot in 0..4 {
        // SAFETY: this run's context; a successful tail call does not return.
        unsafe { ROOT_ARRAY.tail_call(&ctx, slot) };
    }
    count(2);
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
