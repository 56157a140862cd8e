//! Every key of the config file, once: one row a key (name, what its absence means, how
//! its value is read, help), a section a table. The unknown-key check accepts exactly
//! these names, absent keys take these defaults, a test holds docs/configuration.md and
//! `limiter.example.toml` to them, and docs/config.md is generated from them. A plain key
//! (an integer, a word, a path, a string) is one row here: `CONST = "name" => field:
//! Type, ...` declares its field in [`TopKeys`] or [`FleetKeys`], read by the row. A key with logic of its own (a list, an address, a key
//! that needs another) is a row here and its reading in `check`.

use std::path::PathBuf;

use limiter_common::gcra::MAX_RATE;
use limiter_config::{
    schema::TLS_FILE,
    section,
    Absent::{Int, Required, Str, Unset},
    Applies::{Partly, Reload, Restart},
    Kind::{self, Integer, IpAddr, Other, SocketAddr, Table, Tables, Word},
};
use limiter_fleet::share::{
    FailMode, DEFAULT_FLEET_SIZE, DEFAULT_LEASE_TTL_MS, DEFAULT_REPORT_INTERVAL_MS,
    DEFAULT_STICKY_MAX_S, MAX_FLEET_TIMING_MS,
};

use super::words::{
    Bypass, Mode, OnSaturation, Proto, Unit, XdpMode, XdpShare, XdpShareFallback,
    DEFAULT_CONTROL_SOCKET, DEFAULT_METRICS, DEFAULT_PIN_DIR, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6,
    DEFAULT_XDP_PRIORITY, MAX_MAX_SOURCES,
};

const FAIL_MODE_SPELLINGS: &[&str] = &[FailMode::Open.as_str(), FailMode::Static.as_str()];
const _: () = assert!(FailMode::ALL.len() == FAIL_MODE_SPELLINGS.len());

/// A rate or a burst: any count here, then held to the limit arithmetic's bounds.
const COUNT: Kind = Integer {
    min: 0,
    max: u64::MAX,
};
const _: () = assert!(MAX_RATE < u64::MAX);

/// The reference of the daemon's file (docs/config.md, `limiter.toml(5)`).
pub const REFERENCE: limiter_config::reference::Reference = limiter_config::reference::Reference {
    binary: "limiter",
    page: "limiter.toml",
    path: "/etc/limiter/limiter.toml",
    about: "configuration of the limiter daemon: its interfaces, rules and fleet",
    schema: &TOP_KEYS,
    see_also: &[
        "limiter(8)",
        "limiter-run(8)",
        "limiter-check(8)",
        "limiter-reload(8)",
    ],
};

section! {
    /// The top level of the file.
    TOP_KEYS = "", Restart => #[derive(Debug, Clone, PartialEq, Eq)] struct TopKeys {
        INTERFACES = "interfaces", Unset("the --iface options"), Other("an array of interface names"),
            "interfaces to attach to";
        XDP_MODE = "xdp_mode" => xdp_mode: XdpMode, Str(XdpMode::Auto.as_str()), Word(XdpMode::SPELLINGS),
            "how the program is attached";
        XDP_SHARE = "xdp_share" => xdp_share: XdpShare, Str(XdpShare::Exclusive.as_str()), Word(XdpShare::SPELLINGS),
            "whether the limiter has the XDP hook to itself";
        XDP_PRIORITY = "xdp_priority" => xdp_priority: u32, Int(DEFAULT_XDP_PRIORITY as u64),
            Integer { min: 0, max: u32::MAX as u64 },
            "run priority in a libxdp dispatcher (with xdp_share = \"libxdp\")";
        XDP_SHARE_FALLBACK = "xdp_share_fallback" => xdp_share_fallback: XdpShareFallback, Str(XdpShareFallback::None.as_str()),
            Word(XdpShareFallback::SPELLINGS),
            "what xdp_share = \"libxdp\" does where the kernel refuses freplace";
        PIN_DIR = "pin_dir" => pin_dir: PathBuf, Str(DEFAULT_PIN_DIR), Kind::Path, "where the maps are pinned";
        CONTROL_SOCKET = "control_socket" => control_socket: PathBuf, Str(DEFAULT_CONTROL_SOCKET), Kind::Path,
            "the daemon's control socket";
        METRICS = "metrics", Str(DEFAULT_METRICS), SocketAddr,
            "Prometheus listen address; \"\" disables";
        MAX_SOURCES = "max_sources" => max_sources: u32, Int(limiter_common::abi::DEFAULT_MAX_SOURCES as u64),
            Integer { min: 1, max: MAX_MAX_SOURCES as u64 },
            "cells in each row of the per-source sketch";
        BYPASS = "bypass" => bypass: Bypass, Str(Bypass::Off.as_str()), Word(Bypass::SPELLINGS),
            "\"on\": the kill switch, every frame passes unclassified, unmetered and uncounted, set at start and at every reload; \"off\" never clears a switch set by `limiter bypass on`", Reload;
        FLEET_SIZE = "fleet_size" => fleet_size: u32, Int(DEFAULT_FLEET_SIZE as u64),
            Integer { min: 1, max: u32::MAX as u64 },
            "hosts sharing a quota while bootstrapping (quota / fleet_size)";
        RULES = "rules", Unset("no rules"), Tables(&RULE_KEYS), "the rules, in file order", Reload;
        TUNNELS = "tunnels", Unset("no interface decapsulates"), Tables(&TUNNEL_KEYS),
            "interfaces whose tunnelled frames are classified by their inner header", Reload;
        FLEET = "fleet", Unset("standalone"), Table(&FLEET_KEYS), "the allocator to report to";
        MONITOR = "monitor", Unset("sampling off"), Table(&MONITOR_KEYS),
            "sampled drop events for `limiter monitor`", Reload;
        NEXT_PROGRAM = "next_program", Unset("passed frames go to the stack"),
            Other("PIN or PIN:INDEX"), "the program passed frames are handed to",
            Partly("reload: another PIN, another slot of the same array, or none; restart: another array, or between PIN and PIN:INDEX");
        JOIN_PROGRAM_ARRAY = "join_program_array", Unset("not joined"), Other("PIN:INDEX"),
            "the LB's root array slot the limiter sits in";
    }
}

section! {
    /// `[fleet]`.
    FLEET_KEYS = "[fleet]", Restart => #[derive(Debug, Clone, PartialEq, Eq)] struct FleetKeys {
        FLEET_ALLOCATOR = "allocator", Unset("required unless groups"),
            Other("address:port, or a list of them"),
            "the allocator's gRPC address (replicas: every replica's, tried in order)";
        FLEET_GROUPS = "groups", Unset("one group: allocator"), Tables(&FLEET_GROUP_KEYS),
            "sharded allocators: each group's name and replicas (instead of allocator)";
        FLEET_SERVER_NAME = "server_name" => server_name: String, Str("limiter-allocator"), Kind::String,
            "the name in the allocator's certificate";
        FLEET_HOST_ID = "host_id", Unset("the hostname"), Kind::String,
            "this host's fleet-unique id, a name of cert";
        FLEET_CA = "ca" => ca: PathBuf, Required, Kind::Path, "CA of the allocator's certificate", TLS_FILE;
        FLEET_CERT = "cert" => cert: PathBuf, Required, Kind::Path, "this host's client certificate", TLS_FILE;
        FLEET_KEY = "key" => key: PathBuf, Required, Kind::Path, "this host's client key", TLS_FILE;
        FLEET_BIND = "bind", Unset("chosen by the kernel"), IpAddr,
            "local address for allocator traffic";
        FLEET_LEASE_TTL_MS = "lease_ttl_ms" => lease_ttl_ms: u64, Int(DEFAULT_LEASE_TTL_MS),
            Integer { min: 1, max: MAX_FLEET_TIMING_MS }, "how long a grant is valid";
        FLEET_STICKY_MAX_S = "sticky_max_s" => sticky_max_s: u64, Int(DEFAULT_STICKY_MAX_S),
            Integer { min: 1, max: 86_400 * 30 }, "how long a lapsed share is kept";
        FLEET_REPORT_INTERVAL_MS = "report_interval_ms" => report_interval_ms: u64, Int(DEFAULT_REPORT_INTERVAL_MS),
            Integer { min: 1, max: MAX_FLEET_TIMING_MS }, "how often the host reports";
    }
}

section! {
    /// `[monitor]`: the budget of sampled drop events (`limiter monitor` reads them).
    MONITOR_KEYS = "[monitor]", Reload => #[derive(Debug, Clone, Copy, PartialEq, Eq)] struct MonitorKeys {
        MONITOR_EVENTS_PER_SEC = "events_per_sec" => events_per_sec: u32, Int(0),
            Integer { min: 0, max: limiter_common::drop::MAX_EVENTS_PER_SEC as u64 },
            "refusals each CPU samples per second at most; 0: off (the default: events carry the first bytes of customers' frames, and with nobody reading them the ring buffer fills and every later sample counts as lost)";
        MONITOR_SNAP_LEN = "snap_len" => snap_len: u32, Int(limiter_common::drop::MAX_SNAP_LEN as u64),
            Integer { min: 0, max: limiter_common::drop::MAX_SNAP_LEN as u64 },
            "bytes of each sampled frame an event carries, in whole 8-byte words (rounded down)";
    }
}

section! {
    /// One `[[fleet.groups]]` entry: a group of sharded allocators.
    FLEET_GROUP_KEYS = "[[fleet.groups]]", Restart {
        GROUP_NAME = "name", Required, Kind::String,
            "the group's name (its replicas' [election] name)";
        GROUP_ALLOCATOR = "allocator", Required, Other("address:port, or a list of them"),
            "the group's replicas' gRPC addresses, tried in order";
    }
}

section! {
    /// One `[[tunnels]]` entry: what one interface decapsulates.
    TUNNEL_KEYS = "[[tunnels]]", Reload {
        TUNNEL_INTERFACE = "interface", Required, Kind::String,
            "the interface (one entry each)";
        TUNNEL_DECAPSULATE = "decapsulate", Required,
            Other("an array of \"ipip\", \"6in4\", \"gre\", \"fou:PORT\", \"gue:PORT\""),
            "the encapsulations classified by their inner header";
    }
}

section! {
    /// One `[[rules]]` entry.
    RULE_KEYS = "[[rules]]", Reload {
        RULE_NAME = "name", Required, Kind::String, "unique; 1-63 bytes of [A-Za-z0-9._-]";
        RULE_DST = "dst", Required, Other("an IPv4 or IPv6 prefix, or a bare address"),
            "the destination prefix";
        RULE_DST_PORT = "dst_port", Unset("any port"), Integer { min: 1, max: u16::MAX as u64 },
            "the destination port (TCP and UDP)";
        RULE_PROTO = "proto", Str(Proto::Any.as_str()), Word(Proto::SPELLINGS),
            "the protocol matched";
        RULE_UNIT = "unit", Str(Unit::Packets.as_str()), Word(Unit::SPELLINGS), "what is metered";
        RULE_RATE = "rate", Unset("no aggregate limit"), COUNT,
            "aggregate limit, units per second: 1 to 10^12";
        RULE_BURST = "burst", Unset("required with rate"), COUNT, "aggregate burst, units: at least 1 (1518 for bytes), refilled within a year at rate";
        RULE_MODE = "mode", Str(Mode::Enforce.as_str()), Word(Mode::SPELLINGS),
            "whether the rule drops";
        RULE_ENFORCE_PERCENT = "enforce_percent", Int(100),
            Other("a number from 0 to 100, up to three decimals (2.5)"),
            "a canary: the percentage of sources (by source prefix, chosen by a keyed hash) the rule drops for; the others' refusals pass as would-drops. Not with mode \"shadow\"";
        RULE_FAIL_MODE = "fail_mode", Str(FailMode::Open.as_str()), Word(FAIL_MODE_SPELLINGS),
            "what the share does when the allocator is gone";
        RULE_PER_SOURCE = "per_source", Unset("no per-source limit"), Table(&PER_SOURCE_KEYS),
            "a limit per source prefix";
    }
}

section! {
    /// A rule's `[rules.per_source]`.
    PER_SOURCE_KEYS = "[rules.per_source]", Reload {
        PER_SOURCE_RATE = "rate", Required, COUNT, "units per second, per source: 1 to 10^12";
        PER_SOURCE_BURST = "burst", Required, COUNT, "burst per source: at least 1 (1518 for bytes), refilled within a year at rate";
        PER_SOURCE_PREFIX_V4 = "prefix_v4", Int(DEFAULT_PREFIX_V4 as u64),
            Integer { min: 0, max: 32 }, "IPv4 sources are bucketed by this prefix";
        PER_SOURCE_PREFIX_V6 = "prefix_v6", Int(DEFAULT_PREFIX_V6 as u64),
            Integer { min: 0, max: 128 }, "IPv6 sources are bucketed by this prefix";
        PER_SOURCE_ON_SATURATION = "on_saturation", Str(OnSaturation::StandAside.as_str()),
            Word(OnSaturation::SPELLINGS),
            "what the limit does while a flood saturates the rule's cells";
    }
}
