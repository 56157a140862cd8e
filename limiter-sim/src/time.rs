//! Units of virtual time (nanoseconds, the kernel clock's unit) and the simulation's step.

pub const NS_PER_S: u64 = 1_000_000_000;
pub const S: u64 = NS_PER_S;
pub const MS: u64 = 1_000_000;
/// The fleet advances in steps of this: every event happens on a step boundary.
pub const STEP: u64 = MS;
