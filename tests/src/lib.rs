//! Kernel test harness for limiter, shared by the test suites and the benchmark.

pub mod bench;
pub mod evasion;
pub mod fixture;
pub mod frame;
pub mod live;
pub mod netns;
pub mod rx;
pub mod scenario;
pub mod traffic;
