//! The fleet tests' throwaway PKI: the harness's (limiter-tests `pki`, shared with the
//! fleet lab).

#[allow(unused_imports, reason = "each test file uses a different part")]
pub use limiter_tests::pki::{Pair, Pki};
