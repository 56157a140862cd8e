//! Reference programs for benchmarks: the cheapest possible XDP_PASS and XDP_DROP, so
//! every cost is reported as a ratio to something measured in the same run.
#![no_std]
#![no_main]

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp(frags)]
pub fn baseline_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[xdp(frags)]
pub fn baseline_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
