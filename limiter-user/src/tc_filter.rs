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

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::{maps::MapInfo, programs::loaded_programs};
use limiter_common::abi::map_name;

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
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_ID: u16 = 11;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// clsact's ingress parent, TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS).
const INGRESS_PARENT: u32 = 0xffff_fff2;
const NLMSG_HDR: usize = 16;
const TCMSG: usize = 20;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// (type, payload) of each netlink attribute in `b`; stops at the first malformed one.
fn attributes(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(b, at)?);
        let kind = u16_at(b, at + 2)? & NLA_TYPE_MASK;
        if len < 4 {
            return None;
        }
        let payload = b.get(at + 4..at + len)?;
        at += align4(len);
        Some((kind, payload))
    })
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

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
fn parse_dump(buf: &[u8], out: &mut Vec<Filter>) -> io::Result<bool> {
    let mut at = 0;
    while at + NLMSG_HDR <= buf.len() {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply");
        let len = u32_at(buf, at).ok_or_else(bad)? as usize;
        let kind = u16_at(buf, at + 4).ok_or_else(bad)?;
        if len < NLMSG_HDR || at + len > buf.len() {
            return Err(bad());
        }
        let payload = &buf[at + NLMSG_HDR..at + len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(payload, 0).map_or(0, |e| e as i32);
                if errno != 0 {
                    return Err(io::Error::from_raw_os_error(-errno));
                }
            }
            RTM_NEWTFILTER => out.extend(parse_filter(payload)),
            _ => {}
        }
        at += align4(len);
    }
    Ok(false)
}

/// The bpf filters at clsact ingress of interface `ifindex` (none without a clsact qdisc).
pub fn ingress_filters(ifindex: u32) -> io::Result<Vec<Filter>> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = Vec::with_capacity(NLMSG_HDR + TCMSG);
    req.extend(((NLMSG_HDR + TCMSG) as u32).to_ne_bytes());
    req.extend(RTM_GETTFILTER.to_ne_bytes());
    req.extend((NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend(1u32.to_ne_bytes()); // sequence
    req.extend(0u32.to_ne_bytes()); // port id: the kernel's
    req.extend([libc::AF_UNSPEC as u8, 0, 0, 0]);
    req.extend((ifindex as i32).to_ne_bytes());
    req.extend(0u32.to_ne_bytes()); // handle
    req.extend(INGRESS_PARENT.to_ne_bytes());
    req.extend(0u32.to_ne_bytes()); // info
                                    // SAFETY: req is a valid buffer of req.len() bytes.
    let sent = unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: buf is a valid writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 || parse_dump(&buf[..n as usize], &mut out)? {
            return Ok(out);
        }
    }
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
    loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == program_id)
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

/// The limiter's filters (on this pin_dir's maps) at ingress of `ifindex`.
pub fn limiter_filters_on(ifindex: u32, pin_dir: &Path) -> io::Result<Vec<Filter>> {
    let Some(control) = control_map_id(pin_dir) else {
        return Ok(Vec::new());
    };
    Ok(ingress_filters(ifindex)?
        .into_iter()
        .filter(|f| f.program_id.is_some_and(|id| program_uses_map(id, control)))
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
