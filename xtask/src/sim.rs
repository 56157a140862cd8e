//! `cargo xtask sim`: runs the fleet simulator (release). Pure computation in virtual
//! time: no root, no eBPF, no setup. Arguments after `--` go to the simulator
//! (`--only NAME,…`, `--quick`, `--out DIR`).

use anyhow::Result;

use crate::{cargo, run_cmd};

pub fn run(args: &[String]) -> Result<()> {
    run_cmd(
        cargo()
            .args(["run", "--release", "--package", "limiter-sim", "--"])
            .args(args),
    )
}
