//! The one clock of the fleet code: CLOCK_MONOTONIC in nanoseconds. It is the clock of
//! `bpf_ktime_get_ns`, so deadlines computed with it mean the same to the kernel. Every
//! other function in this crate takes `now` as an argument.

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC cannot fail on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
