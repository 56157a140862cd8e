//! The fast receiver: a TC ingress program on the limited end that counts what XDP
//! passed (TC runs after XDP), in total and per IPv4 source, then drops it.

use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{
        tc::{NlOptions, TcAttachOptions, TcHandle},
        SchedClassifier, TcAttachType,
    },
    Ebpf,
};
use limiter_user::host::object::BASELINE_OBJECT;

/// Frames and bytes, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxTotals {
    pub packets: u64,
    pub bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RawTotals {
    packets: u64,
    bytes: u64,
}

// SAFETY: repr(C), two u64, no padding; mirrors RxTotals in the harness program.
unsafe impl aya::Pod for RawTotals {}

/// The counter attached to one interface; detached when dropped.
pub struct RxCounter {
    ebpf: Ebpf,
}

impl RxCounter {
    /// Attaches to `iface`'s TC ingress (root namespace).
    pub fn attach(iface: &str) -> Result<RxCounter> {
        let mut ebpf = Ebpf::load(BASELINE_OBJECT).context("loading the harness programs")?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut("rx_count")
            .context("no rx_count program")?
            .try_into()?;
        prog.load().context("loading rx_count")?;
        if limiter_user::host::kernel::has_tcx() {
            prog.attach(iface, TcAttachType::Ingress)
                .with_context(|| format!("attaching rx_count to {iface} ingress"))?;
        } else {
            // Without tcx, a cls_bpf filter behind the limiter's (a larger priority
            // runs later); the limiter's attach added the clsact qdisc, or this does.
            let _ = aya::programs::tc::qdisc_add_clsact(iface);
            prog.attach_with_options(
                iface,
                TcAttachType::Ingress,
                TcAttachOptions::Netlink(NlOptions {
                    priority: limiter_user::attach::tc_filter::PRIORITY + 0x100,
                    handle: TcHandle::new(0, 1),
                    classid: None,
                }),
            )
            .with_context(|| format!("adding rx_count as a cls_bpf filter to {iface}"))?;
        }
        Ok(RxCounter { ebpf })
    }

    /// Frames received so far.
    pub fn totals(&self) -> Result<RxTotals> {
        let map: PerCpuArray<_, RawTotals> =
            PerCpuArray::try_from(self.ebpf.map("RX_TOTALS").context("no RX_TOTALS")?)?;
        let mut total = RxTotals::default();
        for t in map.get(&0, 0)?.iter() {
            total.packets += t.packets;
            total.bytes += t.bytes;
        }
        Ok(total)
    }

    /// Frames received so far per IPv4 source.
    pub fn per_source(&self) -> Result<BTreeMap<Ipv4Addr, u64>> {
        let map: PerCpuHashMap<_, u32, u64> =
            PerCpuHashMap::try_from(self.ebpf.map("RX_SOURCES").context("no RX_SOURCES")?)?;
        let mut out = BTreeMap::new();
        for entry in map.iter() {
            let (src, per_cpu) = entry?;
            let n: u64 = per_cpu.iter().sum();
            out.insert(Ipv4Addr::from(u32::from_be(src)), n);
        }
        Ok(out)
    }
}
