//! `cargo xtask bench`: runs the benchmark binary of the limiter-bench crate (release).

use anyhow::Result;

use crate::{cargo, run_cmd};

pub fn run(parts: &[String]) -> Result<()> {
    run_cmd(
        cargo()
            .args([
                "run",
                "--release",
                "--package",
                "limiter-bench",
                "--bin",
                "limiter-bench",
                "--",
            ])
            .args(parts),
    )
}
