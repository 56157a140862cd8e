use std::time::{Duration, Instant};

use limiter_user::{
    control::{call, ControlError, Request},
    program::remove_pins,
};

use super::{PinDirArg, SocketArg};

#[derive(Debug, clap::Args)]
pub struct DetachArgs {
    #[command(flatten)]
    socket: SocketArg,
    #[command(flatten)]
    pin_dir: PinDirArg,
}

pub fn execute(args: DetachArgs) -> anyhow::Result<()> {
    match call(&args.socket.socket, &Request::Detach) {
        Ok(_) => {
            // The daemon detaches, removes its pins and exits; wait for it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while args.socket.socket.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            println!("detached; the daemon has exited");
            Ok(())
        }
        // No daemon: remove what an earlier one left pinned.
        Err(ControlError::NotRunning(_)) => {
            let removed = remove_pins(&args.pin_dir.pin_dir)?;
            if removed.is_empty() {
                println!("nothing pinned under {}", args.pin_dir.pin_dir.display());
            } else {
                for path in removed {
                    println!("removed {}", path.display());
                }
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
