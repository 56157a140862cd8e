//! `limiter`: the LB-host daemon and its operator CLI.

mod cli;

use clap::Parser;
use limiter_service::exit::{self, Exit};

fn main() -> std::process::ExitCode {
    limiter_service::metrics::record_start();
    let args = cli::Cli::parse();
    let format = args.log.log_format;
    limiter_service::logging::init(format);
    // `check` keeps its contract: 0 accepted, 1 rejected, whatever the reason.
    let checking = args.is_check();
    match cli::execute(args) {
        Ok(()) => Exit::Success.into(),
        Err(e) => {
            let status = if checking {
                Exit::Failure
            } else {
                exit::classify(e.as_ref(), &limiter_user::exit_status)
            };
            let message = exit::render(e.as_ref());
            limiter_service::logging::failure(format, "limiter", &message, status.code());
            status.into()
        }
    }
}
