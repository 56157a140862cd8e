//! `limiter monitor --pcap FILE`: the sampled frames as pcapng, for tshark, Wireshark
//! and tcpdump. One section; one interface description per interface seen (Ethernet,
//! nanosecond timestamps, the snap length); one enhanced packet block per event, its
//! captured bytes the snap, its original length the frame's, with a comment naming the
//! verdict, reason and rule (as xdpdump does) and the verdict as an XDP action in the
//! `epb_verdict` option. Written in this host's byte order, as the format allows.

use std::{collections::HashMap, io::Write};

use limiter_common::drop::MAX_SNAP_LEN;

use super::{
    event::{Event, Verdict},
    format::{Context, RuleName},
};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 1;
const EPB: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const LINKTYPE_ETHERNET: u16 = 1;

const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
const EPB_VERDICT: u16 = 7;
/// `epb_verdict`'s type byte for a Linux XDP program's action.
const VERDICT_TYPE_XDP: u8 = 2;
/// The XDP actions the verdict option carries.
const XDP_DROP: u64 = 1;
const XDP_PASS: u64 = 2;
/// `epb_flags`: direction inbound.
const FLAGS_INBOUND: u32 = 0b01;

fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_ne_bytes());
    // Option values longer than u16 are cut: only comments could be, and never are.
    let len = value.len().min(usize::from(u16::MAX) - 3);
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&value[..len]);
    pad(out);
}

fn pad(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// A block: type, total length, body (padded to 4), total length again.
fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut padded = body.to_vec();
    pad(&mut padded);
    let total = (padded.len() + 12) as u32;
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&total.to_ne_bytes());
    out.extend_from_slice(&padded);
    out.extend_from_slice(&total.to_ne_bytes());
    out
}

/// The section header block, naming the writer.
pub fn section_header(application: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&BYTE_ORDER_MAGIC.to_ne_bytes());
    body.extend_from_slice(&1u16.to_ne_bytes());
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.extend_from_slice(&(-1i64).to_ne_bytes()); // section length unknown
    option(&mut body, SHB_USERAPPL, application.as_bytes());
    option(&mut body, OPT_END, &[]);
    block(SHB, &body)
}

/// An Ethernet interface with nanosecond timestamps.
pub fn interface_description(name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.extend_from_slice(&(MAX_SNAP_LEN as u32).to_ne_bytes());
    option(&mut body, IF_NAME, name.as_bytes());
    option(&mut body, IF_TSRESOL, &[9]);
    option(&mut body, OPT_END, &[]);
    block(IDB, &body)
}

/// The comment of an event's packet: `verdict=dropped reason=per_source rule=web`.
pub fn comment(e: &Event, cx: &Context) -> String {
    let reason = match e.reason {
        Ok(r) => r.label().to_string(),
        Err(code) => code.to_string(),
    };
    let rule = match &cx.rule {
        RuleName::None => "none".to_string(),
        RuleName::Named(n) => n.clone(),
        RuleName::Gone { slot } => format!("slot-{slot}"),
    };
    format!(
        "limiter verdict={} reason={reason} rule={rule}",
        e.verdict.label()
    )
}

/// The enhanced packet block of `e` on interface number `interface`.
pub fn packet(interface: u32, e: &Event, cx: &Context) -> Vec<u8> {
    let ts = u64::try_from(cx.wall_ns).unwrap_or(0);
    let mut body = Vec::new();
    body.extend_from_slice(&interface.to_ne_bytes());
    body.extend_from_slice(&((ts >> 32) as u32).to_ne_bytes());
    body.extend_from_slice(&(ts as u32).to_ne_bytes());
    body.extend_from_slice(&(e.data.len() as u32).to_ne_bytes());
    // Never less than what was captured, whatever the kernel said.
    body.extend_from_slice(&e.frame_len.max(e.data.len() as u32).to_ne_bytes());
    body.extend_from_slice(&e.data);
    pad(&mut body);
    option(&mut body, OPT_COMMENT, comment(e, cx).as_bytes());
    option(&mut body, EPB_FLAGS, &FLAGS_INBOUND.to_ne_bytes());
    let action = match e.verdict {
        Verdict::Dropped => Some(XDP_DROP),
        Verdict::WouldDrop => Some(XDP_PASS),
        Verdict::Unknown(_) => None,
    };
    if let Some(action) = action {
        let mut v = vec![VERDICT_TYPE_XDP];
        v.extend_from_slice(&action.to_ne_bytes());
        option(&mut body, EPB_VERDICT, &v);
    }
    option(&mut body, OPT_END, &[]);
    block(EPB, &body)
}

/// Writes a pcapng stream: the section header first, an interface description the
/// first time an interface shows up, then its packets.
pub struct PcapWriter<W: Write> {
    out: W,
    /// ifindex -> interface number in the section.
    interfaces: HashMap<u32, u32>,
}

impl<W: Write> PcapWriter<W> {
    pub fn new(mut out: W, application: &str) -> std::io::Result<PcapWriter<W>> {
        out.write_all(&section_header(application))?;
        Ok(PcapWriter {
            out,
            interfaces: HashMap::new(),
        })
    }

    pub fn write(&mut self, e: &Event, cx: &Context) -> std::io::Result<()> {
        let next = self.interfaces.len() as u32;
        let id = match self.interfaces.get(&e.ifindex) {
            Some(id) => *id,
            None => {
                let name = cx
                    .interface
                    .clone()
                    .unwrap_or_else(|| format!("ifindex{}", e.ifindex));
                self.out.write_all(&interface_description(&name))?;
                self.interfaces.insert(e.ifindex, next);
                next
            }
        };
        self.out.write_all(&packet(id, e, cx))
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::{net::IpAddr, process::Command};

    use limiter_common::drop::{DropReason, EVENT_DROPPED, EVENT_WOULD_DROP};

    use super::*;
    use crate::observe::monitor::event::{
        decode,
        frames::{build, L4},
        raw_event,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Blocks are whole: each starts with its type and ends with its length again.
    fn blocks(bytes: &[u8]) -> Vec<(u32, &[u8])> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let kind = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
            let len = u32::from_ne_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0);
            let trailer = u32::from_ne_bytes(bytes[at + len - 4..at + len].try_into().unwrap());
            assert_eq!(trailer as usize, len);
            out.push((kind, &bytes[at + 8..at + len - 4]));
            at += len;
        }
        out
    }

    /// Two events on two interfaces, v4 TCP dropped and v6 UDP would-dropped, and one
    /// frame longer than the snap.
    fn sample_file() -> Vec<u8> {
        let mut w = PcapWriter::new(Vec::new(), "limiter test").unwrap();
        let (s, d) = (ip("198.51.100.7"), ip("198.18.0.10"));
        let tcp = build(
            s,
            d,
            &[],
            L4::Tcp {
                sport: 5123,
                dport: 443,
                flags: 0x02,
            },
            (0, false),
            6,
        );
        let e = decode(&raw_event(
            &tcp,
            s,
            d,
            6,
            (5123, 443),
            DropReason::PerSource,
            EVENT_DROPPED,
            4,
        ));
        let cx = |rule: &str, iface: &str, at: i128| Context {
            rule: RuleName::Named(rule.into()),
            interface: Some(iface.into()),
            wall_ns: at,
        };
        w.write(&e, &cx("web", "veth-a", 1_796_406_723_123_456_789))
            .unwrap();
        let (s6, d6) = (ip("2001:db8::7"), ip("2001:db8::10"));
        let udp = build(
            s6,
            d6,
            &[],
            L4::Udp {
                sport: 53000,
                dport: 53,
            },
            (0, false),
            1000,
        );
        let mut raw = raw_event(
            &udp,
            s6,
            d6,
            17,
            (53000, 53),
            DropReason::Aggregate,
            EVENT_WOULD_DROP,
            1,
        );
        raw.ifindex = 9;
        w.write(
            &decode(&raw),
            &cx("dns", "veth-b", 1_796_406_724_000_000_000),
        )
        .unwrap();
        w.out
    }

    #[test]
    fn blocks_are_well_formed_and_interfaces_described_once() {
        let bytes = sample_file();
        let kinds: Vec<u32> = blocks(&bytes).iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, [SHB, IDB, EPB, IDB, EPB]);
        let (_, epb) = blocks(&bytes)[4];
        let captured = u32::from_ne_bytes(epb[12..16].try_into().unwrap());
        let original = u32::from_ne_bytes(epb[16..20].try_into().unwrap());
        assert_eq!(captured as usize, MAX_SNAP_LEN);
        assert_eq!(original as usize, 14 + 40 + 8 + 1000);
    }

    fn tool(name: &str, args: &[&str]) -> String {
        let out = Command::new(name).args(args).output().unwrap_or_else(|e| {
            panic!("{name} is needed to read the pcapng back (apt-get install {name}): {e}")
        });
        assert!(
            out.status.success(),
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The file as Debian's tshark and tcpdump read it: addresses, ports, lengths, the
    /// comment and the timestamps.
    #[test]
    fn tshark_and_tcpdump_read_the_file_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drops.pcapng");
        std::fs::write(&path, sample_file()).unwrap();
        let file = path.to_str().unwrap();
        let fields = tool(
            "tshark",
            &[
                "-r",
                file,
                "-T",
                "fields",
                "-E",
                "separator=;",
                "-e",
                "frame.interface_name",
                "-e",
                "ip.src",
                "-e",
                "ipv6.src",
                "-e",
                "ipv6.dst",
                "-e",
                "tcp.srcport",
                "-e",
                "tcp.dstport",
                "-e",
                "udp.dstport",
                "-e",
                "frame.len",
                "-e",
                "frame.cap_len",
                "-e",
                "frame.comment",
                "-e",
                "frame.time_epoch",
                "-e",
                "frame.verdict.ebpf_xdp",
            ],
        );
        let lines: Vec<&str> = fields.lines().collect();
        assert_eq!(lines.len(), 2, "{fields}");
        let first: Vec<&str> = lines[0].split(';').collect();
        assert_eq!(first[0], "veth-a", "{fields}");
        assert_eq!(first[1], "198.51.100.7", "{fields}");
        assert_eq!((first[4], first[5]), ("5123", "443"), "{fields}");
        assert_eq!((first[7], first[8]), ("60", "60"), "{fields}");
        assert_eq!(
            first[9], "limiter verdict=dropped reason=per_source rule=web",
            "{fields}"
        );
        assert!(first[10].starts_with("1796406723.123456789"), "{fields}");
        assert_eq!(
            first[11],
            XDP_DROP.to_string(),
            "the verdict as XDP's action"
        );
        let second: Vec<&str> = lines[1].split(';').collect();
        assert_eq!(second[0], "veth-b", "{fields}");
        assert_eq!((second[2], second[3]), ("2001:db8::7", "2001:db8::10"));
        assert_eq!(second[6], "53", "{fields}");
        assert_eq!((second[7], second[8]), ("1062", "128"), "{fields}");
        assert_eq!(
            second[9], "limiter verdict=would_drop reason=aggregate rule=dns",
            "{fields}"
        );
        assert_eq!(second[11], XDP_PASS.to_string(), "a would-drop passed");
        let dump = tool("tcpdump", &["-nn", "-tt", "-r", file]);
        let lines: Vec<&str> = dump.lines().collect();
        assert_eq!(lines.len(), 2, "{dump}");
        assert!(
            lines[0].contains("198.51.100.7.5123 > 198.18.0.10.443: Flags [S]"),
            "{dump}"
        );
        assert!(lines[0].starts_with("1796406723.123456"), "{dump}");
        assert!(
            lines[1].contains("2001:db8::7.53000 > 2001:db8::10.53"),
            "{dump}"
        );
    }
}
