//! Readers of the maps, for operators: counters and rule state (`stats`), one frame's
//! path through the rules (`explain`), live rates (`top`) and sampled refusals
//! (`monitor`).

pub mod explain;
pub mod monitor;
pub mod stats;
pub mod top;
