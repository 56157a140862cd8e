//! A libxdp-compatible multi-program dispatcher (protocol version 2, xdp-tools'
//! `lib/libxdp/protocol.org`), installed by the daemon with `xdp_share = "libxdp"` on an
//! interface where nothing runs yet, so that xdp-loader and other libxdp users can join
//! later. It is the same program libxdp builds from `xdp-dispatcher.c`: ten stub
//! functions that components replace with freplace (BPF_PROG_TYPE_EXT) links, called in
//! order while each returns an action in its slot's chain-call bitmap; the slot list is
//! `conf` in `.rodata`, filled in before load and frozen, so the verifier drops the calls
//! to unused slots.
//!
//! What makes libxdp recognise it: the program name `xdp_dispatcher`, exactly one map
//! (the `.rodata`, read-only to the program), and `conf.magic`/`conf.dispatcher_version`.
//! The stubs must stay global functions (bpf-linker gives `#[no_mangle]` functions global
//! BTF linkage), since the kernel only lets freplace replace global functions.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    helpers::generated::bpf_xdp_adjust_tail,
    macros::xdp,
    programs::XdpContext,
};
use limiter_common::dispatcher::{DispatcherConfig, STUB_RETVAL};

/// Filled in by the daemon before load (`DispatcherConfig` of limiter-common).
#[unsafe(no_mangle)]
static conf: DispatcherConfig = DispatcherConfig::EMPTY;

/// A slot's stub. The volatile return value keeps the compiler from assuming what a
/// stub returns (a component replaces it); the no-op tail adjustment makes the kernel
/// count the stub as changing packet data, so a component that does may replace it
/// (libxdp's stubs do the same since 1.4).
macro_rules! stubs {
    ($($name:ident),*) => {$(
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $name(ctx: *mut xdp_md) -> i32 {
            let mut ret = 0i32;
            // SAFETY: a local.
            unsafe { core::ptr::write_volatile(&mut ret, STUB_RETVAL as i32) };
            if ctx.is_null() {
                return xdp_action::XDP_ABORTED as i32;
            }
            // SAFETY: the context pointer the kernel passed.
            unsafe { bpf_xdp_adjust_tail(ctx.cast(), 0) };
            // SAFETY: a local.
            unsafe { core::ptr::read_volatile(&ret) }
        }
    )*};
}

stubs!(prog0, prog1, prog2, prog3, prog4, prog5, prog6, prog7, prog8, prog9);

/// The configuration is read as the kernel sees it, not as the compiler does: it is
/// patched after compilation.
#[inline(always)]
fn enabled() -> u8 {
    // SAFETY: a field of a static.
    unsafe { core::ptr::read_volatile(&raw const conf.num_progs_enabled) }
}

#[inline(always)]
fn chains(slot: usize, ret: i32) -> bool {
    // SAFETY: a field of a static; slot < MAX_COMPONENTS at every call.
    let actions = unsafe { core::ptr::read_volatile(&raw const conf.chain_call_actions[slot]) };
    (1u32.wrapping_shl(ret as u32)) & actions != 0
}

#[xdp]
pub fn xdp_dispatcher(ctx: XdpContext) -> u32 {
    let ctx = ctx.ctx;
    let n = enabled();
    macro_rules! slot {
        ($index:literal, $stub:ident) => {
            if n < $index + 1 {
                return xdp_action::XDP_PASS;
            }
            let ret = $stub(ctx);
            if !chains($index, ret) {
                return ret as u32;
            }
        };
    }
    slot!(0, prog0);
    slot!(1, prog1);
    slot!(2, prog2);
    slot!(3, prog3);
    slot!(4, prog4);
    slot!(5, prog5);
    slot!(6, prog6);
    slot!(7, prog7);
    slot!(8, prog8);
    slot!(9, prog9);
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
