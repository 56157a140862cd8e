//! The TC build as a cls_bpf filter, for kernels without tcx links (before 6.6).
//!
//! A netlink filter is not a bpf_link: nothing can be pinned, and it stays on the
//! interface when the process that added it exits, which is what enforcement across
//! daemon restarts needs. So the limiter keeps exactly one filter per interface, at a fixed
//! slot of the clsact ingress hook ([`PRIORITY`], [`HANDLE`]); a restart replaces the
//! program in that slot in place (the kernel swaps it under RCU: no frame goes
//! unfiltered), never deletes and re-adds it. Which filters are the limiter's is read from
//! the kernel, not remembered: a bpf filter whose program uses the CONTROL map pinned
//! under this pin_dir. `status` shows them and `detach` removes them, whatever slot an
//! earlier build or a failed attempt left them in.

use std::{io, path::Path};

use aya::maps::MapInfo;
use limiter_common::abi::map_name;

#[cfg(test)]
use crate::attach::netlink::{NLMSG_DONE, NLMSG_ERROR, NLMSG_HDR};
use crate::{
    attach::netlink::{attributes, c_string, message, transact, u32_at, NLM_F_DUMP, NLM_F_REQUEST},
    host::loaded::program_info,
};

/// Priority of the limiter's filter: 1, the first the kernel runs (lower runs earlier).
pub const PRIORITY: u16 = 1;
/// Handle of the limiter's filter at [`PRIORITY`] ("LM").
pub const HANDLE: u32 = 0x4c4d;

/// One bpf filter at clsact ingress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub priority: u16,
    pub handle: u32,
    /// The name it was added with (TCA_BPF_NAME).
    pub name: Option<String>,
    /// The program it runs (TCA_BPF_ID).
    pub program_id: Option<u32>,
}

impl Filter {
    pub fn describe(&self) -> String {
        format!(
            "cls_bpf filter at clsact ingress, priority {}, handle {:#x}",
            self.priority, self.handle
        )
    }
}

const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_ID: u16 = 11;
/// clsact's ingress parent, TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS).
const INGRESS_PARENT: u32 = 0xffff_fff2;
const TCMSG: usize = 20;

/// Parses one RTM_NEWTFILTER payload (tcmsg and attributes): a bpf filter, or `None`
/// for another kind, and for the per-priority entry a dump starts each priority with
/// (handle 0).
fn parse_filter(payload: &[u8]) -> Option<Filter> {
    let handle = u32_at(payload, 8)?;
    let info = u32_at(payload, 16)?;
    if handle == 0 {
        return None;
    }
    let mut kind = None;
    let mut name = None;
    let mut program_id = None;
    for (t, value) in attributes(payload.get(TCMSG..)?) {
        match t {
            TCA_KIND => kind = Some(c_string(value)),
            TCA_OPTIONS => {
                for (t, value) in attributes(value) {
                    match t {
                        TCA_BPF_NAME => name = Some(c_string(value)),
                        TCA_BPF_ID => program_id = u32_at(value, 0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (kind.as_deref() == Some("bpf")).then_some(Filter {
        priority: (info >> 16) as u16,
        handle,
        name,
        program_id,
    })
}

/// Parses one buffer of a dump's reply into `out`; `true` once the dump is done.
fn push_filter(kind: u16, payload: &[u8], out: &mut Vec<Filter>) {
    if kind == RTM_NEWTFILTER {
        out.extend(parse_filter(payload));
    }
}

#[cfg(test)]
fn parse_dump(buf: &[u8], out: &mut Vec<Filter>) -> io::Result<bool> {
    crate::attach::netlink::walk(buf, |kind, payload| push_filter(kind, payload, out))
}

/// The bpf filters at clsact ingress of interface `ifindex` (none without a clsact qdisc).
pub fn ingress_filters(ifindex: u32) -> io::Result<Vec<Filter>> {
    let mut tcmsg = Vec::with_capacity(TCMSG);
    tcmsg.extend([libc::AF_UNSPEC as u8, 0, 0, 0]);
    tcmsg.extend((ifindex as i32).to_ne_bytes());
    tcmsg.extend(0u32.to_ne_bytes()); // handle
    tcmsg.extend(INGRESS_PARENT.to_ne_bytes());
    tcmsg.extend(0u32.to_ne_bytes()); // info
    let mut out = Vec::new();
    transact(
        &message(RTM_GETTFILTER, NLM_F_REQUEST | NLM_F_DUMP, &tcmsg),
        |kind, payload| push_filter(kind, payload, &mut out),
    )?;
    Ok(out)
}

/// The id of the CONTROL map pinned under `pin_dir`: the mark of this instance's programs.
pub fn control_map_id(pin_dir: &Path) -> Option<u32> {
    MapInfo::from_pin(pin_dir.join(map_name::CONTROL))
        .ok()
        .map(|m| m.id())
}

/// Whether program `id` uses map `control_id` (is a build of the limiter on this
/// pin_dir's maps).
pub fn program_uses_map(program_id: u32, control_id: u32) -> bool {
    program_info(program_id)
        .and_then(|p| p.map_ids().ok().flatten())
        .is_some_and(|ids| ids.contains(&control_id))
}

/// Interfaces of this network namespace: (name, ifindex).
pub fn interfaces() -> io::Result<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/class/net")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(index) = std::fs::read_to_string(entry.path().join("ifindex")) else {
            continue;
        };
        if let Ok(index) = index.trim().parse() {
            out.push((name, index));
        }
    }
    out.sort();
    Ok(out)
}

/// Whether program `id` is this pin_dir's limiter: one of its pinned programs
/// (`prog_<id>`, readable with any capabilities), or, where this process may open
/// programs by id (CAP_SYS_ADMIN), any build on its CONTROL map.
pub fn program_is_ours(pin_dir: &Path, id: u32) -> bool {
    crate::bpf::pins::pinned_program_ids(pin_dir).contains(&id)
        || control_map_id(pin_dir).is_some_and(|control| program_uses_map(id, control))
}

/// The limiter's filters (on this pin_dir's maps) at ingress of `ifindex`.
pub fn limiter_filters_on(ifindex: u32, pin_dir: &Path) -> io::Result<Vec<Filter>> {
    if control_map_id(pin_dir).is_none() {
        return Ok(Vec::new());
    }
    Ok(ingress_filters(ifindex)?
        .into_iter()
        .filter(|f| f.program_id.is_some_and(|id| program_is_ours(pin_dir, id)))
        .collect())
}

/// Every filter of the limiter's (on this pin_dir's maps) in this network namespace.
pub fn limiter_filters(pin_dir: &Path) -> io::Result<Vec<(String, Filter)>> {
    let mut out = Vec::new();
    if control_map_id(pin_dir).is_none() {
        return Ok(out);
    }
    for (iface, ifindex) in interfaces()? {
        // An interface that went away between the listing and the dump has no filters.
        let Ok(filters) = limiter_filters_on(ifindex, pin_dir) else {
            continue;
        };
        out.extend(filters.into_iter().map(|f| (iface.clone(), f)));
    }
    Ok(out)
}

/// Deletes one filter (through aya's netlink code: the same request it attaches with).
pub fn remove(iface: &str, filter: &Filter) -> Result<(), String> {
    use aya::programs::{
        links::Link as _,
        tc::{SchedClassifierLink, TcHandle},
        TcAttachType,
    };
    SchedClassifierLink::attached(
        iface,
        TcAttachType::Ingress,
        filter.priority,
        TcHandle::from(filter.handle),
        None,
    )
    .map_err(|e| e.to_string())?
    .detach()
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend(((4 + payload.len()) as u16).to_ne_bytes());
        a.extend(kind.to_ne_bytes());
        a.extend(payload);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((NLMSG_HDR + payload.len()) as u32).to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend(2u16.to_ne_bytes());
        m.extend(1u32.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(payload);
        m
    }

    fn tcmsg(handle: u32, priority: u16, attrs: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; 4];
        t.extend(7i32.to_ne_bytes());
        t.extend(handle.to_ne_bytes());
        t.extend(INGRESS_PARENT.to_ne_bytes());
        t.extend(((u32::from(priority) << 16) | 0x0300).to_ne_bytes());
        t.extend(attrs);
        t
    }

    fn bpf_filter(handle: u32, priority: u16, name: &str, id: u32) -> Vec<u8> {
        let mut options = attr(TCA_BPF_NAME, format!("{name}\0").as_bytes());
        options.extend(attr(TCA_BPF_ID, &id.to_ne_bytes()));
        let mut attrs = attr(TCA_KIND, b"bpf\0");
        attrs.extend(attr(TCA_OPTIONS, &options));
        message(RTM_NEWTFILTER, &tcmsg(handle, priority, &attrs))
    }

    #[test]
    fn a_dump_yields_the_bpf_filters_and_ends_at_done() {
        let mut buf = Vec::new();
        // The per-priority entry (handle 0), a bpf filter, a u32 filter, then done.
        buf.extend(message(
            RTM_NEWTFILTER,
            &tcmsg(0, 1, &attr(TCA_KIND, b"bpf\0")),
        ));
        buf.extend(bpf_filter(HANDLE, PRIORITY, "limiter_tc", 42));
        buf.extend(message(
            RTM_NEWTFILTER,
            &tcmsg(0x800, 2, &attr(TCA_KIND, b"u32\0")),
        ));
        buf.extend(message(NLMSG_DONE, &0i32.to_ne_bytes()));
        let mut out = Vec::new();
        assert!(parse_dump(&buf, &mut out).unwrap());
        assert_eq!(
            out,
            vec![Filter {
                priority: PRIORITY,
                handle: HANDLE,
                name: Some("limiter_tc".into()),
                program_id: Some(42),
            }]
        );
    }

    #[test]
    fn an_error_reply_is_an_error_and_a_truncated_one_is_refused() {
        let mut out = Vec::new();
        let err = parse_dump(&message(NLMSG_ERROR, &(-22i32).to_ne_bytes()), &mut out);
        assert_eq!(err.unwrap_err().raw_os_error(), Some(22));
        let mut m = bpf_filter(1, 1, "x", 1);
        m.truncate(m.len() - 3);
        assert!(parse_dump(&m, &mut out).is_err());
        // Attributes that run past their message are ignored, not read past.
        let mut bad = tcmsg(5, 1, &attr(TCA_KIND, b"bpf\0"));
        bad.extend([200, 0, TCA_OPTIONS as u8, 0]);
        assert_eq!(parse_filter(&bad).map(|f| f.program_id), Some(None));
    }
}
