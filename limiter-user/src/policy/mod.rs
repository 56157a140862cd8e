//! What the kernel must hold, computed from the config (pure: no maps, no files, no
//! logs; `tests/tests/layers.rs` holds every file here to that). The daemon does the I/O
//! with what these return.

pub mod fleet;
pub mod hook;
pub mod reload_plan;
pub mod ruleset;
pub mod saturation;
pub mod sketch_regions;
