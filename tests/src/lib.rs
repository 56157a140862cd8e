//! Kernel test harness for limiter, shared by the test suites (tests/tests/) and the
//! benchmark and lab (the limiter-bench crate).

pub mod binaries;
#[cfg(test)]
mod docs;
pub mod etcd;
pub mod evasion;
pub mod fixture;
pub mod frame;
pub mod guide;
pub mod handoff;
pub mod live;
pub mod netns;
pub mod pki;
pub mod prometheus;
pub mod rx;
pub mod scenario;
pub mod systemd_unit;
pub mod tools;
pub mod traffic;
pub mod xdp_tools;

/// Whether the tests run in an emulated guest (`cargo xtask test --kernel`, which sets
/// `LIMITER_IN_GUEST`). Such a guest moves only 15–20 k frames/s, so the rate tests it
/// runs scale their rates down by [`guest_scale`].
pub fn in_guest() -> bool {
    std::env::var_os("LIMITER_IN_GUEST").is_some()
}

/// `rate` on this machine, a tenth of it in an emulated guest.
pub fn guest_scale(rate: u64) -> u64 {
    if in_guest() {
        rate / 10
    } else {
        rate
    }
}

/// A table of tests, one `#[test]` per row: `name => expression;`, each row a test of its
/// own, named by its row (so a failing row names itself and `cargo test NAME` runs one).
/// The matrices of the suites (mode × unit, xdp mode × scenario) are written with it, so
/// a new case is one row:
///
/// ```text
/// limiter_tests::test_rows! {
///     native_packets_1k => rate_matrix(XdpMode::Native, Unit::Packets, 1_000);
///     /// Doc comments and attributes go on the row.
///     tc_packets_100k => rate_matrix(XdpMode::Tc, Unit::Packets, 100_000);
/// }
/// ```
#[macro_export]
macro_rules! test_rows {
    ($($(#[$meta:meta])* $name:ident => $body:expr;)*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $name() {
                $body;
            }
        )*
    };
}
