//! Programs at interfaces' hooks: loading the builds, attaching them (native or generic
//! XDP links, tcx or cls_bpf filters, libxdp's dispatcher, the tail-call takeover), the
//! handoff to the program after the limiter, and tearing it all down. The netlink
//! requests aya does not expose sit here too.

pub mod handoff;
pub mod libxdp;
pub mod netlink;
pub mod program;
pub mod takeover;
pub mod tc_filter;
pub mod teardown;
