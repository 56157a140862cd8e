//! The daemon as a service on the async runtime: the control socket, the metrics
//! exporter, the fleet report loop, and how they all end.

pub mod control;
pub mod metrics;
pub mod reporter;
pub mod service;
pub mod shutdown;
