use clap::Subcommand;
use limiter_service::cli_args::QuotaSetArgs;
use limiter_user::serve::control::{call, Request};

use super::{print_json, SocketArg};

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Each rule's aggregate rate and burst in force, and where it comes from.
    List {
        #[command(flatten)]
        socket: SocketArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a rule's aggregate rate (and burst) now, keeping every bucket. Lasts until
    /// the next reload or restart: edit the config to make it permanent.
    Set {
        #[command(flatten)]
        quota: QuotaSetArgs,
        #[command(flatten)]
        socket: SocketArg,
    },
}

pub fn execute(cmd: QuotaCommand) -> anyhow::Result<()> {
    match cmd {
        QuotaCommand::List { socket, json } => {
            let list = call(&socket.socket, &Request::QuotaList)?;
            if json {
                return print_json(&list);
            }
            println!(
                "{:<24} {:<8} {:>14} {:>14}  SOURCE",
                "RULE", "UNIT", "RATE", "BURST"
            );
            for q in list.as_array().into_iter().flatten() {
                let num = |v: &serde_json::Value| v.as_u64().map_or("-".into(), |n| n.to_string());
                println!(
                    "{:<24} {:<8} {:>14} {:>14}  {}",
                    q["rule"].as_str().unwrap_or("?"),
                    q["unit"].as_str().unwrap_or("?"),
                    num(&q["rate"]),
                    num(&q["burst"]),
                    q["source"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        QuotaCommand::Set {
            quota: QuotaSetArgs { rule, rate, burst },
            socket,
        } => {
            let q = call(&socket.socket, &Request::QuotaSet { rule, rate, burst })?;
            println!(
                "{}: rate {} burst {} ({})",
                q["rule"].as_str().unwrap_or("?"),
                q["rate"],
                q["burst"],
                q["unit"].as_str().unwrap_or("?")
            );
            Ok(())
        }
    }
}
