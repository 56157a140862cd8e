//! Programs for tests and benchmarks, never for production:
//! - `baseline_pass` / `baseline_drop`: the cheapest possible XDP_PASS and XDP_DROP, so
//!   every cost is reported as a ratio to something measured in the same run;
//!   `baseline_tc_drop` the same at TC ingress;
//! - `traffic_tx`: a traffic generator. Run with BPF_PROG_TEST_RUN in live-frames mode on
//!   a veth end, it transmits every injected frame out of that end (XDP_TX);
//! - `rx_count`: a TC ingress counter for the receiving end. TC runs after XDP, so it
//!   counts exactly what XDP passed, per CPU and per IPv4 source, at any packet rate;
//! - `cand_*`: per-source structures the bench measures side by side (`candidates`).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

#[path = "baseline/candidates.rs"]
mod candidates;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    btf_maps::{PerCpuArray, PerCpuHashMap},
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};

#[xdp(frags)]
pub fn baseline_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[xdp(frags)]
pub fn baseline_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

/// The cheapest TC ingress drop: what a limiter at TC would pay on skb-born frames before
/// any work of its own, with no XDP program forcing veth's copy into a page.
#[classifier]
pub fn baseline_tc_drop(_ctx: TcContext) -> i32 {
    TC_ACT_SHOT as i32
}

#[xdp(frags)]
pub fn traffic_tx(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_TX
}

/// A flood from forged sources: `traffic_tx` with a fresh random source in every frame
/// it transmits. An IPv4 frame gets a source in 198.18.0.0/15 (all 131,072 of them: the
/// test network), an IPv6 frame a random /64 of 2001:db8::/32 (bytes 4..8 of the
/// address, 2^32 of them). Checksums are left stale: the limiter does not read them, and
/// the frames end at the test's veth. With [`SPRAY_MASK`] set at load, the sources are a
/// fixed set instead (an established working set).
#[xdp(frags)]
pub fn traffic_tx_spray(ctx: XdpContext) -> u32 {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + SPRAY_OFFSET + 4 > end {
        return xdp_action::XDP_TX;
    }
    // SAFETY: a helper without arguments.
    let r = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() };
    // SAFETY: a read-only global the loader may set.
    let r = r & unsafe { core::ptr::read_volatile(&SPRAY_MASK) };
    // SAFETY: bytes 12..14 and SPRAY_OFFSET..+4 are within the frame (checked above).
    unsafe {
        let ethertype = *((data + 12) as *const [u8; 2]);
        let at = (data + SPRAY_OFFSET) as *mut [u8; 4];
        if ethertype == [0x08, 0x00] {
            *at = [198, 18 | ((r >> 16) & 1) as u8, (r >> 8) as u8, r as u8];
        } else if ethertype == [0x86, 0xdd] {
            *at = r.to_be_bytes();
        }
    }
    xdp_action::XDP_TX
}

/// The bits of the random word `traffic_tx_spray` keeps: all for a new source every frame;
/// 0xFFFF for 2^16 IPv4 sources (198.18.0.0/16) and 2^16 IPv6 /64s.
#[no_mangle]
static SPRAY_MASK: u32 = u32::MAX;

/// The IPv4 source address, and bytes 4..8 of the IPv6 one (its /64 beyond the /32),
/// both at the same offset of an untagged frame.
const SPRAY_OFFSET: usize = ETH_HLEN + 12;

/// Frames and bytes received, per CPU.
#[repr(C)]
pub struct RxTotals {
    pub packets: u64,
    pub bytes: u64,
}

#[btf_map]
static RX_TOTALS: PerCpuArray<RxTotals, 1> = PerCpuArray::new();

/// Frames received per IPv4 source address (network byte order), per CPU.
#[btf_map]
static RX_SOURCES: PerCpuHashMap<u32, u64, 131072> = PerCpuHashMap::new();

const ETH_HLEN: usize = 14;
const IPV4_SRC_OFFSET: usize = ETH_HLEN + 12;

#[classifier]
pub fn rx_count(ctx: TcContext) -> i32 {
    if let Some(t) = RX_TOTALS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, only this CPU's run touches it.
        unsafe {
            (*t).packets += 1;
            (*t).bytes += u64::from(ctx.len());
        }
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + IPV4_SRC_OFFSET + 4 <= end {
        // SAFETY: bounds checked just above.
        let (ethertype, src) = unsafe {
            (
                *((data + 12) as *const [u8; 2]),
                *((data + IPV4_SRC_OFFSET) as *const u32),
            )
        };
        if ethertype == [0x08, 0x00] {
            match RX_SOURCES.get_ptr_mut(&src) {
                // SAFETY: per-CPU value.
                Some(n) => unsafe { *n += 1 },
                None => {
                    let _ = RX_SOURCES.insert(&src, &1, 0);
                }
            }
        }
    }
    // Counted; the stack has nothing to do with test traffic.
    TC_ACT_SHOT as i32
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
