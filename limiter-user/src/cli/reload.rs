use limiter_user::control::{call, Request};

use super::SocketArg;

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    socket: SocketArg,
}

pub fn execute(args: ReloadArgs) -> anyhow::Result<()> {
    let r = call(&args.socket.socket, &Request::Reload)?;
    println!("reloaded: {} rules", r["rules"]);
    let later: Vec<&str> = r["needs_restart"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    if !later.is_empty() {
        println!(
            "changed, takes effect at the next start: {}",
            later.join(", ")
        );
    }
    Ok(())
}
