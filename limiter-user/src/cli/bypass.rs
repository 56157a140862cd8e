//! `limiter bypass on|off`: the kill switch. Through the daemon when one answers (it
//! serialises the write with its own installs and logs it); without one, straight into
//! the pinned `CONTROL` map, which the program reads at every frame.

use limiter_common::abi::CONTROL_BYPASS;
use limiter_user::{
    bpf::maps::Maps,
    serve::control::{call, ControlError, Request},
};

use super::{PinDirArg, SocketArg};

#[derive(Debug, clap::Args)]
pub struct BypassArgs {
    /// `on`: every frame passes unclassified, unmetered and uncounted, on every interface
    /// and hook of this limiter, at once; `off`: enforce again. Without it: show the
    /// switch.
    #[arg(value_parser = ["on", "off"])]
    switch: Option<String>,
    #[command(flatten)]
    socket: SocketArg,
    #[command(flatten)]
    pin_dir: PinDirArg,
}

fn describe(on: bool) -> &'static str {
    if on {
        "bypass on: every frame passes unclassified, unmetered and uncounted until `limiter \
         bypass off`"
    } else {
        "bypass off: enforcing"
    }
}

pub fn execute(args: BypassArgs) -> anyhow::Result<()> {
    let Some(switch) = args.switch else {
        let maps = Maps::from_pins(&args.pin_dir.pin_dir)?;
        println!("{}", describe(maps.control()?.flags & CONTROL_BYPASS != 0));
        return Ok(());
    };
    let on = switch == "on";
    match call(&args.socket.socket, &Request::Bypass { on }) {
        Ok(r) => {
            println!("{}", describe(on));
            if !on && r["config_on"] == true {
                println!(
                    "note: the daemon's config says bypass = \"on\": its next start or reload \
                     sets the switch again"
                );
            }
            Ok(())
        }
        // No daemon: the pins are the switch (the program keeps running on its links).
        Err(ControlError::NotRunning { .. }) => {
            Maps::from_pins(&args.pin_dir.pin_dir)?.set_bypass(on)?;
            println!(
                "{} (no daemon answers: written to {})",
                describe(on),
                args.pin_dir.pin_dir.display()
            );
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
