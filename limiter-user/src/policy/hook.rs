//! What runs at an interface's hook, as `limiter status` and `limiter explain` show it.

/// One program at an interface's hook, in run order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainEntry {
    pub program_id: u32,
    pub name: String,
    /// A build of this limiter.
    pub limiter: bool,
    /// How the frame gets here and goes on.
    pub how: String,
}
