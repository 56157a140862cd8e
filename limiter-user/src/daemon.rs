//! The daemon's lifecycle: load (or adopt) the program and its pinned maps, install the
//! configured rules, attach, and detach on stop.

use crate::{
    config::Config,
    error::Error,
    maps::Maps,
    program::{Attachment, LoadOptions, Program},
    ruleset,
};

pub struct Daemon {
    program: Program,
    maps: Maps,
    attachments: Vec<Attachment>,
}

/// Compiles `config`'s rules, keeping the slots that `maps` already gives them, and
/// installs them atomically.
pub fn apply_rules(maps: &mut Maps, config: &Config) -> Result<ruleset::RuleTable, Error> {
    let previous = maps.live_slots()?;
    let slots = ruleset::assign_slots(&previous, &config.rules)?;
    let table = ruleset::compile(&config.rules, &slots)?;
    maps.install(&table)?;
    Ok(table)
}

impl Daemon {
    /// Loads the program with maps pinned under the config's `pin_dir`, installs the
    /// rules, then attaches to every interface (rules first, so no frame is seen by a
    /// program without them).
    pub fn start(config: &Config, ifaces: &[String]) -> Result<Daemon, Error> {
        let mut program = Program::load(&LoadOptions {
            pin_dir: Some(config.pin_dir.clone()),
            max_sources: config.max_sources,
        })?;
        let mut maps = program.maps()?;
        let table = apply_rules(&mut maps, config)?;
        tracing::info!(rules = table.rules.len(), "rules installed");
        let mut daemon = Daemon {
            program,
            maps,
            attachments: Vec::new(),
        };
        for iface in ifaces {
            let attachment = daemon.program.attach(iface, config.xdp_mode)?;
            tracing::info!(iface = %attachment.iface, mode = attachment.mode.as_str(), "attached");
            daemon.attachments.push(attachment);
        }
        Ok(daemon)
    }

    pub fn maps(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// Detaches from every interface. The pinned maps stay (counters survive restarts).
    pub fn stop(&mut self) -> Result<(), Error> {
        for attachment in self.attachments.drain(..) {
            let iface = attachment.iface.clone();
            self.program.detach(attachment)?;
            tracing::info!(%iface, "detached");
        }
        Ok(())
    }
}
