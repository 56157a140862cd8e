//! The real program loaded into the kernel with a rule set from a config text, and
//! counter snapshots to compare before and after.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context as _, Result};
use aya::programs::{TestRun, TestRunOptions};
use limiter_common::{
    abi::{GlobalCounters, HeaderCounters, RuleCounters, TunnelCounters},
    drop::{ReasonCounters, NO_RULE},
};
use limiter_user::{
    attach::program::{LoadOptions, Program},
    bpf::maps::Maps,
    config::Config,
    daemon::{apply_rules, apply_tunnels},
    host::object::Variant,
    policy::ruleset::RuleTable,
};

use crate::netns::require_root;

/// The program with private (unpinned) maps and the rules of one config.
pub struct Loaded {
    pub program: Program,
    /// The build [`Loaded::run`] runs (the multi-buffer one unless chosen; the TC build's
    /// verdicts are translated to XDP ones, see [`xdp_verdict_of_tc`]).
    pub variant: Variant,
    pub maps: Maps,
    pub table: RuleTable,
    pub config: Config,
}

/// The config text with `pin_dir` etc. defaulted; only `[[rules]]` matter here.
pub fn load(config_text: &str) -> Result<Loaded> {
    load_with(config_text, None, &Variant::ALL)
}

/// [`load`] verifying only `variant`'s build (the libxdp component's as plain XDP), set to
/// run it: each table runs one build on maps of its own, and every build the program
/// does not run here costs verifier time (about 3 s for an XDP build and 7 s for the TC
/// one on 6.1 under emulation, against 12 s for all three at every load). That every
/// build loads is `kernel_report`'s and every daemon start's check.
pub fn load_build(config_text: &str, variant: Variant) -> Result<Loaded> {
    let builds: &[Variant] = match variant {
        Variant::Libxdp => &[],
        v => &[v],
    };
    let mut loaded = load_with(config_text, None, builds)?;
    if variant == Variant::Libxdp {
        loaded
            .program
            .load_as_xdp(variant)
            .context("loading the libxdp component's build as plain XDP")?;
    }
    loaded.variant = variant;
    Ok(loaded)
}

/// [`load`] with the maps pinned under `pin_dir` (for a second load on the same maps,
/// such as the libxdp component).
pub fn load_pinned(config_text: &str, pin_dir: &Path) -> Result<Loaded> {
    load_with(config_text, Some(pin_dir), &Variant::ALL)
}

fn load_with(config_text: &str, pin_dir: Option<&Path>, builds: &[Variant]) -> Result<Loaded> {
    require_root()?;
    let config = Config::parse(config_text, Path::new("<test config>"))?;
    let mut program = Program::load_builds(
        &LoadOptions {
            pin_dir: pin_dir.map(Path::to_path_buf),
            max_sources: config.max_sources,
            handoff_array: None,
        },
        builds,
    )?;
    let mut maps = program.maps()?;
    let table = apply_rules(&mut maps, &config)?;
    apply_tunnels(&mut maps, &config)?;
    Ok(Loaded {
        program,
        variant: Variant::MultiBuffer,
        maps,
        table,
        config,
    })
}

/// Counters of every rule (by name) and the global ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub rules: BTreeMap<String, RuleCounters>,
    pub global: GlobalCounters,
    pub headers: HeaderCounters,
    pub tunnels: TunnelCounters,
    /// Refusals by reason, per rule (by name).
    pub reasons: BTreeMap<String, ReasonCounters>,
    /// Refusals no rule decides (`DROP_REASONS[NO_RULE]`).
    pub no_rule: ReasonCounters,
}

impl Loaded {
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut rules = BTreeMap::new();
        let mut reasons = BTreeMap::new();
        for (name, slot) in &self.table.slots {
            rules.insert(name.clone(), self.maps.rule_counters(*slot)?);
            reasons.insert(name.clone(), self.maps.reason_counters(*slot)?);
        }
        Ok(Snapshot {
            rules,
            global: self.maps.global_counters()?,
            headers: self.maps.header_counters()?,
            tunnels: self.maps.tunnel_counters()?,
            reasons,
            no_rule: self.maps.reason_counters(NO_RULE)?,
        })
    }

    /// Runs the program once on `frame` through BPF_PROG_TEST_RUN; returns the verdict.
    pub fn run(&self, frame: &[u8]) -> Result<u32> {
        self.run_repeat(frame, 1).map(|(verdict, _)| verdict)
    }

    /// Runs `repeat` times; returns the last verdict and the mean ns per run.
    pub fn run_repeat(&self, frame: &[u8], repeat: u32) -> Result<(u32, u64)> {
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.repeat = repeat;
        let context = || format!("BPF_PROG_TEST_RUN on a {}-byte frame", frame.len());
        let result = if self.variant == Variant::Tc {
            self.program.tc()?.test_run(opts).with_context(context)?
        } else {
            self.program
                .xdp_variant(self.variant)?
                .test_run(opts)
                .with_context(context)?
        };
        let verdict = match self.variant {
            Variant::Tc => xdp_verdict_of_tc(result.return_value),
            _ => result.return_value,
        };
        Ok((verdict, result.duration.as_nanos() as u64))
    }
}

/// The TC build's verdict in XDP terms, so one table checks every build: TC_ACT_SHOT is
/// XDP_DROP, TC_ACT_UNSPEC ("not mine: next program, else the stack") is XDP_PASS.
/// Anything else is returned offset by 1000, which no expectation matches.
pub fn xdp_verdict_of_tc(code: u32) -> u32 {
    const TC_ACT_SHOT: u32 = 2;
    const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
    match code {
        TC_ACT_SHOT => 1,
        TC_ACT_UNSPEC => 2,
        other => 1000 + other,
    }
}

/// Counter changes between two snapshots.
pub fn delta(before: &Snapshot, after: &Snapshot) -> Snapshot {
    Snapshot {
        headers: after.headers.since(&before.headers),
        tunnels: after.tunnels.since(&before.tunnels),
        rules: after
            .rules
            .iter()
            .map(|(name, b)| {
                let a = before.rules.get(name).copied().unwrap_or_default();
                (name.clone(), b.since(&a))
            })
            .collect(),
        global: after.global.since(&before.global),
        reasons: after
            .reasons
            .iter()
            .map(|(name, b)| {
                let a = before.reasons.get(name).copied().unwrap_or_default();
                (name.clone(), b.since(&a))
            })
            .collect(),
        no_rule: after.no_rule.since(&before.no_rule),
    }
}
