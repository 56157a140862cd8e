//! `limiter`: the LB-host daemon and its operator CLI.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    limiter_service::logging::init();
    match cli::execute(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("limiter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
