//! Arguments both binaries' command lines take the same way, so that `limiter quota set`
//! and `limiter-allocator quota set` read alike and say the same in their help.

/// `quota set RULE --rate N [--burst N]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct QuotaSetArgs {
    /// Rule name.
    pub rule: String,
    /// New rate, in the rule's unit per second.
    #[arg(long)]
    pub rate: u64,
    /// New burst (default: keep the current one; a rule that has none yet needs one).
    #[arg(long)]
    pub burst: Option<u64>,
}
