use std::time::{Duration, Instant};

use limiter_user::{
    attach::teardown::{self, Cleanup},
    bpf::pins,
    serve::control::{call, ControlError, Request},
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
    let pin_dir = &args.pin_dir.pin_dir;
    match call(&args.socket.socket, &Request::Detach) {
        Ok(_) => {
            // The daemon detaches, removes its pins and exits; wait for it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while args.socket.socket.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            println!("detached; the daemon has exited");
            // Whatever is still there is not the limiter's: the daemon left it.
            print_left(pin_dir, &survey_left(pin_dir));
            Ok(())
        }
        // No daemon: remove what an earlier one left pinned.
        Err(ControlError::NotRunning { .. }) => {
            let Cleanup {
                removed,
                removed_filters,
                left,
                removed_slots,
                gave_back,
            } = teardown::remove_pins(pin_dir)?;
            if removed.is_empty()
                && removed_filters.is_empty()
                && left.is_empty()
                && gave_back.is_empty()
            {
                println!("nothing pinned under {}", pin_dir.display());
            }
            for hook in gave_back {
                println!("{hook}");
            }
            for slot in removed_slots {
                println!("removed the limiter from {slot}");
            }
            for filter in removed_filters {
                println!("removed {filter}");
            }
            for path in removed {
                println!("removed {}", path.display());
            }
            print_left(pin_dir, &left);
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// What is left under `pin_dir` after the daemon's cleanup, with the reason.
fn survey_left(pin_dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let Ok(entries) = std::fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    let mut left: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let why = match pins::parse_name(&name) {
                None => "not a name the limiter pins under".to_string(),
                Some(pin) => match pins::check_ours(&e.path(), pin) {
                    Err(why) => why,
                    Ok(()) => "the limiter's, yet not removed (see the daemon's log)".into(),
                },
            };
            (e.path(), why)
        })
        .collect();
    left.sort();
    left
}

fn print_left(pin_dir: &std::path::Path, left: &[(std::path::PathBuf, String)]) {
    for (path, why) in left {
        eprintln!("left {} in place: {why}", path.display());
    }
    if left.iter().any(|(path, _)| path != pin_dir) {
        eprintln!(
            "kept {} (not empty: it holds pins the limiter did not create)",
            pin_dir.display()
        );
    }
}
