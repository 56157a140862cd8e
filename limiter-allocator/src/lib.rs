//! The allocator's library: its config, its state (the quota split, no I/O), the peer
//! bounds, the gRPC service and listener, and the etcd coordination of replicas. The
//! binary (`main.rs`) wires them into a process; the benchmark drives [`state::State`]
//! directly.

pub mod config;
pub mod coordination;
pub mod election;
pub mod hosts;
pub mod limits;
pub mod listener;
pub mod service;
pub mod state;

pub use limiter_fleet::clock::monotonic_ns as now_ns;
