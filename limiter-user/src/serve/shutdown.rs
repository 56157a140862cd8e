//! How the daemon ends. A signal or a `limiter detach` request broadcasts one
//! [`Shutdown`]; every service loop (control socket, metrics, fleet reports) subscribes
//! and returns, and the service runner then stops the daemon the way it says.

/// How the daemon should end, as told by a signal or a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// SIGINT/SIGTERM: exit; enforcement stays unless --detach-on-exit.
    Exit,
    /// `limiter detach`: detach everywhere, remove every pin, exit.
    Detach,
}
