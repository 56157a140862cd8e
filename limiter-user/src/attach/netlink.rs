//! rtnetlink, by hand: the few requests the limiter makes that aya does not expose (the
//! TC filter dump, and the XDP attachment as libxdp makes it, through netlink rather than
//! a bpf_link so that libxdp can replace it), and finding an interface's index. Parsing is pure and stops at the first
//! malformed attribute rather than reading past it.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use crate::error::Error;

pub(crate) const NLM_F_REQUEST: u16 = 1;
pub(crate) const NLM_F_ACK: u16 = 4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLA_F_NESTED: u16 = 0x8000;
pub(crate) const NLMSG_HDR: usize = 16;

pub(crate) fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// (type, payload) of each netlink attribute in `b`; stops at the first malformed one.
pub(crate) fn attributes(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
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

pub(crate) fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Appends one attribute (`nested`: its payload is attributes).
pub(crate) fn push_attr(out: &mut Vec<u8>, kind: u16, nested: bool, payload: &[u8]) {
    let kind = if nested { kind | NLA_F_NESTED } else { kind };
    out.extend(((4 + payload.len()) as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(payload);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// A message: header (length filled in), then `body`.
pub(crate) fn message(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR + body.len());
    m.extend(((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
    m.extend(kind.to_ne_bytes());
    m.extend(flags.to_ne_bytes());
    m.extend(1u32.to_ne_bytes()); // sequence
    m.extend(0u32.to_ne_bytes()); // port id: the kernel's
    m.extend(body);
    m
}

/// Walks the messages of one reply buffer: `each(kind, payload)` for every message that
/// is neither an error nor the end; `Ok(true)` once the end (NLMSG_DONE, or the ack of a
/// request) is seen.
pub(crate) fn walk(buf: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<bool> {
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
                // An ack: the request is done.
                return Ok(true);
            }
            _ => each(kind, payload),
        }
        at += align4(len);
    }
    Ok(false)
}

/// Sends `request` on a new NETLINK_ROUTE socket and hands every reply message to
/// `each` until the kernel says it is done.
pub(crate) fn transact(request: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
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
    // SAFETY: request is a valid buffer of request.len() bytes.
    let sent = unsafe { libc::send(sock.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: buf is a valid writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 || walk(&buf[..n as usize], &mut each)? {
            return Ok(());
        }
    }
}

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// RTNLGRP_LINK as a bit of `nl_groups`: link created, changed, deleted.
const RTMGRP_LINK: u32 = 1;
const RTM_SETLINK: u16 = 19;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
/// Fail if a program is attached already.
pub(crate) const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Replace only the program IFLA_XDP_EXPECTED_FD names (EEXIST otherwise).
pub(crate) const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// Where an XDP program runs on an interface, as netlink reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    Native,
    Generic,
    /// Offloaded, or several modes at once: the limiter does not share such a hook.
    Other,
}

impl XdpAttached {
    /// The netlink mode flag of this mode.
    pub(crate) fn flag(self) -> u32 {
        match self {
            XdpAttached::Native => XDP_FLAGS_DRV_MODE,
            XdpAttached::Generic => XDP_FLAGS_SKB_MODE,
            XdpAttached::Other => 0,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            XdpAttached::Native => "native",
            XdpAttached::Generic => "generic",
            XdpAttached::Other => "offloaded or multi-mode",
        }
    }
}

fn ifinfomsg(ifindex: u32) -> Vec<u8> {
    let mut m = vec![libc::AF_UNSPEC as u8, 0];
    m.extend(0u16.to_ne_bytes()); // type
    m.extend((ifindex as i32).to_ne_bytes());
    m.extend(0u32.to_ne_bytes()); // flags
    m.extend(0u32.to_ne_bytes()); // change
    m
}

/// Parses IFLA_XDP out of one RTM_NEWLINK payload.
pub(crate) fn parse_xdp(payload: &[u8]) -> Option<(u32, XdpAttached)> {
    let (_, xdp) = attributes(payload.get(16..)?).find(|(t, _)| *t == IFLA_XDP)?;
    let mut attached = 0u8;
    let (mut any, mut drv, mut skb) = (None, None, None);
    for (t, v) in attributes(xdp) {
        match t {
            IFLA_XDP_ATTACHED => attached = *v.first()?,
            IFLA_XDP_PROG_ID => any = u32_at(v, 0),
            IFLA_XDP_DRV_PROG_ID => drv = u32_at(v, 0),
            IFLA_XDP_SKB_PROG_ID => skb = u32_at(v, 0),
            _ => {}
        }
    }
    match attached {
        0 => None,
        1 => Some((any.or(drv)?, XdpAttached::Native)),
        2 => Some((any.or(skb)?, XdpAttached::Generic)),
        _ => Some((any.or(drv).or(skb).unwrap_or(0), XdpAttached::Other)),
    }
}

/// The XDP program on `ifindex` and its mode; `None` when there is none.
pub fn xdp_program(ifindex: u32) -> io::Result<Option<(u32, XdpAttached)>> {
    // A plain GETLINK gets one reply and no end marker: ask for the ack as well, so
    // [`transact`] knows when the answer is complete.
    let request = message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK, &ifinfomsg(ifindex));
    let mut found = None;
    transact(&request, |kind, payload| {
        if kind == RTM_NEWLINK {
            found = parse_xdp(payload);
        }
    })?;
    Ok(found)
}

/// Sets the XDP program of `ifindex` to `prog_fd` (-1: none) with `flags`; with
/// `expected`, only if that program is the one attached now (XDP_FLAGS_REPLACE), which
/// makes the swap atomic against a concurrent writer: EEXIST when it lost the race.
pub(crate) fn set_xdp(
    ifindex: u32,
    prog_fd: i32,
    flags: u32,
    expected: Option<i32>,
) -> io::Result<()> {
    let mut xdp = Vec::new();
    push_attr(&mut xdp, IFLA_XDP_FD, false, &prog_fd.to_ne_bytes());
    let flags = if expected.is_some() {
        flags | XDP_FLAGS_REPLACE
    } else {
        flags
    };
    push_attr(&mut xdp, IFLA_XDP_FLAGS, false, &flags.to_ne_bytes());
    if let Some(fd) = expected {
        push_attr(&mut xdp, IFLA_XDP_EXPECTED_FD, false, &fd.to_ne_bytes());
    }
    let mut body = ifinfomsg(ifindex);
    push_attr(&mut body, IFLA_XDP, true, &xdp);
    transact(
        &message(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, &body),
        |_, _| {},
    )
}

/// A link as an rtnetlink message describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEvent {
    /// RTM_DELLINK: the device is gone.
    pub deleted: bool,
    pub ifindex: u32,
    pub name: String,
    pub mtu: Option<u32>,
    /// Its kind ("veth", "bond", "dummy"); `None`: a physical device.
    pub kind: Option<String>,
}

/// Parses one RTM_NEWLINK or RTM_DELLINK message (`None` for any other, or one without
/// a name).
pub(crate) fn parse_link(kind: u16, payload: &[u8]) -> Option<LinkEvent> {
    let deleted = match kind {
        RTM_NEWLINK => false,
        RTM_DELLINK => true,
        _ => return None,
    };
    // struct ifinfomsg: family, pad, type (u16), index (i32), flags, change.
    let ifindex = u32_at(payload, 4)?;
    let (mut name, mut mtu, mut link_kind) = (None, None, None);
    for (t, v) in attributes(payload.get(16..)?) {
        match t {
            IFLA_IFNAME => name = Some(c_string(v)),
            IFLA_MTU => mtu = u32_at(v, 0),
            IFLA_LINKINFO => {
                link_kind = attributes(v)
                    .find(|(t, _)| *t == IFLA_INFO_KIND)
                    .map(|(_, k)| c_string(k));
            }
            _ => {}
        }
    }
    Some(LinkEvent {
        deleted,
        ifindex,
        name: name?,
        mtu,
        kind: link_kind,
    })
}

/// The link `ifindex` now; `None` when there is no such device.
pub fn link(ifindex: u32) -> io::Result<Option<LinkEvent>> {
    let request = message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK, &ifinfomsg(ifindex));
    let mut found = None;
    match transact(&request, |kind, payload| {
        if let Some(l) = parse_link(kind, payload) {
            found = Some(l);
        }
    }) {
        Ok(()) => Ok(found),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A socket that hears of every link created, changed or deleted in this network
/// namespace (RTNLGRP_LINK), non-blocking.
pub struct LinkMonitor {
    sock: OwnedFd,
}

/// What one drain of a [`LinkMonitor`] read.
#[derive(Debug, Default)]
pub struct LinkEvents {
    pub events: Vec<LinkEvent>,
    /// The kernel dropped messages (the socket's buffer overflowed, ENOBUFS): anything
    /// may have changed.
    pub lost: bool,
}

impl LinkMonitor {
    pub fn open() -> io::Result<LinkMonitor> {
        // SAFETY: plain socket(2); the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields that matter are set.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = RTMGRP_LINK;
        // SAFETY: a valid sockaddr_nl of the size given.
        let bound = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkMonitor { sock })
    }

    /// Reads every message waiting, without blocking.
    pub fn drain(&self) -> io::Result<LinkEvents> {
        let mut out = LinkEvents::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(out),
                    Some(libc::ENOBUFS) => out.lost = true,
                    Some(libc::EINTR) => {}
                    _ => return Err(e),
                }
                continue;
            }
            // A malformed message ends its buffer, not the monitor: the daemon checks
            // every interface on `lost`.
            if walk(&buf[..n as usize], |kind, payload| {
                if let Some(event) = parse_link(kind, payload) {
                    out.events.push(event);
                }
            })
            .is_err()
            {
                out.lost = true;
            }
        }
    }
}

impl std::os::fd::AsRawFd for LinkMonitor {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

/// The index of interface `iface`.
pub(crate) fn ifindex_of(iface: &str) -> Result<u32, Error> {
    let c = CString::new(iface).map_err(|_| Error::Link {
        what: format!("finding interface {iface:?}"),
        reason: "a NUL byte in the name".into(),
    })?;
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(Error::Io {
            what: format!("finding interface {iface}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn link_reply(xdp: &[u8]) -> Vec<u8> {
        let mut body = ifinfomsg(7);
        push_attr(&mut body, 3, false, b"veth0\0"); // IFLA_IFNAME
        push_attr(&mut body, IFLA_XDP, true, xdp);
        body
    }

    #[test]
    fn the_xdp_attribute_gives_program_and_mode() {
        let mut xdp = Vec::new();
        push_attr(&mut xdp, IFLA_XDP_ATTACHED, false, &[2]);
        push_attr(&mut xdp, IFLA_XDP_PROG_ID, false, &77u32.to_ne_bytes());
        assert_eq!(
            parse_xdp(&link_reply(&xdp)),
            Some((77, XdpAttached::Generic))
        );
        let mut none = Vec::new();
        push_attr(&mut none, IFLA_XDP_ATTACHED, false, &[0]);
        assert_eq!(parse_xdp(&link_reply(&none)), None);
        // Truncated: no answer rather than a read past the end.
        let mut cut = link_reply(&xdp);
        cut.truncate(cut.len() - 6);
        assert_eq!(parse_xdp(&cut), None);
    }

    #[test]
    fn a_link_message_gives_index_name_mtu_and_kind() {
        let mut body = ifinfomsg(7);
        push_attr(&mut body, IFLA_IFNAME, false, b"veth0\0");
        push_attr(&mut body, IFLA_MTU, false, &9000u32.to_ne_bytes());
        let mut info = Vec::new();
        push_attr(&mut info, IFLA_INFO_KIND, false, b"veth\0");
        push_attr(&mut body, IFLA_LINKINFO, true, &info);
        let event = parse_link(RTM_NEWLINK, &body).unwrap();
        assert_eq!(
            event,
            LinkEvent {
                deleted: false,
                ifindex: 7,
                name: "veth0".into(),
                mtu: Some(9000),
                kind: Some("veth".into()),
            }
        );
        assert!(parse_link(RTM_DELLINK, &body).unwrap().deleted);
        assert_eq!(parse_link(RTM_GETLINK, &body), None);
        // Cut inside the name: no name, no event, no read past the end.
        assert_eq!(parse_link(RTM_NEWLINK, &body[..22]), None);
        assert_eq!(parse_link(RTM_NEWLINK, &body[..6]), None);
    }

    #[test]
    fn an_error_reply_is_an_error_and_an_ack_ends_the_walk() {
        let err = walk(&message(NLMSG_ERROR, 0, &(-17i32).to_ne_bytes()), |_, _| {});
        assert_eq!(err.unwrap_err().raw_os_error(), Some(17));
        assert!(walk(&message(NLMSG_ERROR, 0, &0i32.to_ne_bytes()), |_, _| {}).unwrap());
        let mut m = message(RTM_NEWLINK, 0, &[0; 20]);
        m.truncate(m.len() - 3);
        assert!(walk(&m, |_, _| {}).is_err());
    }
}
