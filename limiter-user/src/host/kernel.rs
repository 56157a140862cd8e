//! What the running kernel offers the daemon, found out at start.
//!
//! Distribution kernels run on LB fleets (Debian 12's 6.1, its 6.12 backport), so the
//! daemon cannot assume this machine's kernel: each feature it relies on is checked here
//! once, and the caller either uses a working equivalent or refuses with an error that
//! names the feature and the kernel that has it.

use std::fmt;

use crate::config::XdpMode as ConfigXdpMode;

/// A kernel version as major.minor.patch (Debian's and Ubuntu's package version where the
/// release string hides it: `6.1.0-57-amd64` is the package version it was built from, e.g. 6.1.192).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// tcx links (BPF_LINK_TYPE_TCX) for the TC build: Linux 6.6.
pub const TCX: Version = Version::new(6, 6, 0);

/// The running kernel's version, as aya reads it (Debian's and Ubuntu's package version
/// first). `None` if it cannot be read.
pub fn running() -> Option<Version> {
    let v = aya::util::KernelVersion::current().ok()?;
    parse(&v.to_string())
}

/// `major.minor.patch` (what aya's `KernelVersion` displays).
pub fn parse(s: &str) -> Option<Version> {
    let mut parts = s.trim().splitn(3, '.').map(str::parse::<u32>);
    Some(Version::new(
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    ))
}

/// Whether the running kernel has tcx links (else the TC build runs as a cls_bpf filter
/// under a clsact qdisc). `LIMITER_TC_HOOK=cls_bpf` takes the filter path on any kernel:
/// the tests use it to run that path on this machine's kernel too.
pub fn has_tcx() -> bool {
    if std::env::var_os(TC_HOOK_ENV).is_some_and(|v| v == "cls_bpf") {
        return false;
    }
    running().is_some_and(|v| v >= TCX)
}

/// The environment variable [`has_tcx`] reads.
pub const TC_HOOK_ENV: &str = "LIMITER_TC_HOOK";

/// `uname -r` (the release string: `6.1.0-57-amd64`, where [`running`] reads the package version
/// from the package version).
pub fn release() -> Option<String> {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: the kernel NUL-terminates `release` within its length.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    Some(release.to_string_lossy().into_owned())
}

/// What the program (limiter-ebpf) and the daemon rely on, each with the first mainline
/// kernel that has it. Read off limiter-ebpf/src (maps.rs, meter.rs, main.rs) and the
/// daemon's attach paths; versions from the kernel commits named on each row (the
/// table of bcc's docs/kernel-versions.md lists the same ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// BPF_MAP_TYPE_PERCPU_ARRAY (the counters): 4.6, a10423b87a7e.
    PerCpuArray,
    /// BPF_MAP_TYPE_LRU_HASH (per-source buckets, fragment records): 4.10, 29ba732acbee.
    LruHash,
    /// BPF_MAP_TYPE_LPM_TRIE with BPF_F_NO_PREALLOC (the prefix tables): 4.11,
    /// b95a5c4db09b.
    LpmTrie,
    /// BPF_F_MMAPABLE arrays (rules, aggregate buckets, hosts: page-aligned values, read
    /// by the daemon through mmap): 5.5, fc9702273e2e.
    MmapableArray,
    /// The bpf_jiffies64 helper (the meters' coarse clock): 5.5, 5576b991e9c1.
    Jiffies64,
    /// BPF_ATOMIC with BPF_FETCH and BPF_CMPXCHG (the meters' compare-and-swap, fetching
    /// adds): 5.12, 5ffa25502b5a ("bpf: Add instructions for atomic_[cmp]xchg").
    Atomics,
    /// bpf_link for XDP (BPF_LINK_CREATE/UPDATE on an interface: pinned links that
    /// survive the daemon, atomic program replacement): 5.9, aa8d3a716b59.
    XdpLink,
    /// XDP multi-buffer (BPF_F_XDP_HAS_FRAGS and bpf_xdp_get_buff_len, the multi-buffer
    /// build): 5.18, c2f2cdbeffda and 0165cc817075.
    XdpFrags,
    /// tcx links (BPF_LINK_TYPE_TCX) for the TC build: 6.6, e420bed02507.
    Tcx,
}

impl Feature {
    pub const ALL: [Feature; 9] = [
        Feature::PerCpuArray,
        Feature::LruHash,
        Feature::LpmTrie,
        Feature::MmapableArray,
        Feature::Jiffies64,
        Feature::Atomics,
        Feature::XdpLink,
        Feature::XdpFrags,
        Feature::Tcx,
    ];

    /// The first mainline kernel with it.
    pub const fn since(self) -> Version {
        match self {
            Feature::PerCpuArray => Version::new(4, 6, 0),
            Feature::LruHash => Version::new(4, 10, 0),
            Feature::LpmTrie => Version::new(4, 11, 0),
            Feature::MmapableArray | Feature::Jiffies64 => Version::new(5, 5, 0),
            Feature::Atomics => Version::new(5, 12, 0),
            Feature::XdpLink => Version::new(5, 9, 0),
            Feature::XdpFrags => Version::new(5, 18, 0),
            Feature::Tcx => TCX,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Feature::PerCpuArray => "per-CPU array maps",
            Feature::LruHash => "LRU hash maps",
            Feature::LpmTrie => "LPM trie maps",
            Feature::MmapableArray => "mmapable array maps (BPF_F_MMAPABLE)",
            Feature::Jiffies64 => "the bpf_jiffies64 helper",
            Feature::Atomics => "BPF atomic compare-and-exchange and fetch instructions",
            Feature::XdpLink => "bpf_link for XDP",
            Feature::XdpFrags => "XDP multi-buffer (xdp.frags)",
            Feature::Tcx => "tcx links",
        }
    }

    /// Whether a missing feature has a working equivalent, and which one.
    pub const fn equivalent(self) -> Option<&'static str> {
        match self {
            Feature::XdpFrags => {
                Some("the linear build only (native mode on interfaces whose MTU fits one buffer)")
            }
            Feature::Tcx => Some("a cls_bpf filter under a clsact qdisc"),
            _ => None,
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What probes found, feature by feature: `None` where no probe ran or it could not
/// tell. A probe's answer overrides the version (distribution kernels backport).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probes(std::collections::BTreeMap<Feature, bool>);

impl Probes {
    pub fn none() -> Probes {
        Probes::default()
    }

    pub fn with(mut self, feature: Feature, present: bool) -> Probes {
        self.0.insert(feature, present);
        self
    }

    pub fn get(&self, feature: Feature) -> Option<bool> {
        self.0.get(&feature).copied()
    }

    /// Probes what can be probed without attaching anything: creating one tiny map or
    /// loading one two-instruction program per feature, closed at once. bpf_link for
    /// XDP and tcx cannot be probed without attaching to an interface: the version
    /// decides those.
    pub fn run() -> Probes {
        use aya::{
            maps::MapType,
            programs::ProgramType,
            sys::{is_helper_supported, is_map_supported, BpfHelper},
        };
        let mut p = Probes::none();
        if !has_tcx() && running().is_some_and(|v| v >= TCX) {
            // LIMITER_TC_HOOK=cls_bpf: the filter path on a kernel with tcx (tests).
            p = p.with(Feature::Tcx, false);
        }
        for (feature, map_type) in [
            (Feature::PerCpuArray, MapType::PerCpuArray),
            (Feature::LruHash, MapType::LruHash),
            (Feature::LpmTrie, MapType::LpmTrie),
        ] {
            if let Ok(found) = is_map_supported(map_type) {
                p = p.with(feature, found);
            }
        }
        if let Ok(found) = is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_jiffies64) {
            p = p.with(Feature::Jiffies64, found);
        }
        if let Some(found) = probe::mmapable_array() {
            p = p.with(Feature::MmapableArray, found);
        }
        if let Some(found) = probe::atomics() {
            p = p.with(Feature::Atomics, found);
        }
        let get_buff_len =
            is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_get_buff_len).ok();
        if let (Some(flag), Some(helper)) = (probe::xdp_frags_flag(), get_buff_len) {
            p = p.with(Feature::XdpFrags, flag && helper);
        }
        p
    }
}

/// How the daemon runs on this kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    pub kernel: Version,
    /// The multi-buffer build loads (xdp frags); without it only the linear build
    /// loads, and interfaces whose MTU needs several buffers cannot run the program in
    /// native mode.
    pub multi_buffer: bool,
    /// How the TC build attaches (`xdp_mode = "tc"`).
    pub tc_hook: TcHook,
    /// Features found by probe on a kernel older than their mainline version
    /// (backports).
    pub backported: Vec<Feature>,
}

/// How the TC build is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcHook {
    /// A tcx link (6.6 and later).
    Tcx,
    /// A cls_bpf filter under a clsact qdisc (before 6.6).
    ClsBpf,
}

impl TcHook {
    pub fn as_str(self) -> &'static str {
        match self {
            TcHook::Tcx => "tcx link",
            TcHook::ClsBpf => "cls_bpf filter under clsact",
        }
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {}: builds {}; TC hook: {}",
            self.kernel,
            if self.multi_buffer {
                "linear, multi-buffer, tc"
            } else {
                "linear, tc (no xdp frags: no multi-buffer build)"
            },
            self.tc_hook.as_str()
        )?;
        if !self.backported.is_empty() {
            let names: Vec<&str> = self.backported.iter().map(|f| f.as_str()).collect();
            write!(f, "; found by probe (backported): {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// A kernel without something the configured mode cannot do without.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "xdp_mode = \"{mode}\" needs {feature} (Linux {since}); this kernel is {kernel}{how}",
    mode = mode.as_str(),
    since = short(feature.since()),
    how = if *probed { " and a probe found it missing" } else { "" }
)]
pub struct MissingFeature {
    pub feature: Feature,
    pub mode: ConfigXdpMode,
    pub kernel: Version,
    /// A probe, not only the version, found it missing.
    pub probed: bool,
}

fn short(v: Version) -> String {
    format!("{}.{}", v.major, v.minor)
}

/// The features `mode` cannot run without (the equivalents aside).
fn required(mode: ConfigXdpMode) -> impl Iterator<Item = Feature> {
    const EVERY_BUILD: [Feature; 6] = [
        Feature::PerCpuArray,
        Feature::LruHash,
        Feature::LpmTrie,
        Feature::MmapableArray,
        Feature::Jiffies64,
        Feature::Atomics,
    ];
    let extra: &[Feature] = match mode {
        ConfigXdpMode::Auto | ConfigXdpMode::Native => &[Feature::XdpLink],
        // Generic mode runs only the multi-buffer build (the linear one would make the
        // kernel linearize every multi-buffer skb).
        ConfigXdpMode::Generic => &[Feature::XdpLink, Feature::XdpFrags],
        ConfigXdpMode::Tc => &[],
    };
    EVERY_BUILD.into_iter().chain(extra.iter().copied())
}

/// Whether `kernel` (with what `probes` found) runs the program in `mode`, and how.
/// Pure: the daemon calls it at start with [`running`] and [`Probes::run`].
pub fn check(
    kernel: Version,
    mode: ConfigXdpMode,
    probes: &Probes,
) -> Result<Support, MissingFeature> {
    let has = |f: Feature| probes.get(f).unwrap_or(kernel >= f.since());
    if let Some(feature) = required(mode).find(|&f| !has(f)) {
        return Err(MissingFeature {
            feature,
            mode,
            kernel,
            probed: probes.get(feature) == Some(false),
        });
    }
    Ok(Support {
        kernel,
        multi_buffer: has(Feature::XdpFrags),
        tc_hook: if has(Feature::Tcx) {
            TcHook::Tcx
        } else {
            TcHook::ClsBpf
        },
        backported: Feature::ALL
            .into_iter()
            .filter(|&f| probes.get(f) == Some(true) && kernel < f.since())
            .collect(),
    })
}

/// Whether the multi-buffer build can load here (probed once per process; the version
/// decides when the probe cannot tell).
pub fn has_frags() -> bool {
    static FRAGS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FRAGS.get_or_init(|| {
        probe::xdp_frags_flag()
            .unwrap_or_else(|| running().is_some_and(|v| v >= Feature::XdpFrags.since()))
    })
}

/// Probes by raw BPF_PROG_LOAD / BPF_MAP_CREATE, for what aya's probes do not cover
/// (flags and instructions). Each is paired with a control without the feature: when
/// the control fails too (no privileges, memlock), the probe cannot tell.
mod probe {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    const BPF_F_MMAPABLE: u32 = 1 << 10;
    const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;

    /// The head of union bpf_attr for BPF_PROG_LOAD; the rest stays zero, as the kernel
    /// requires of fields it does not know.
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        rest: [u64; 12],
    }

    #[repr(C)]
    #[derive(Default)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        rest: [u32; 27],
    }

    /// `r0 = XDP_PASS; exit`
    const PASS: [u64; 2] = [insn(0xb7, 0, 0, 0, 2), insn(0x95, 0, 0, 0, 0)];
    /// `*(u64 *)(r10 - 8) = 0; r0 = 0; r0 = cmpxchg_64(r10 - 8, r0, r1 = 1);
    /// r0 = XDP_PASS; exit`
    const CMPXCHG: [u64; 6] = [
        insn(0x7a, 10, 0, -8, 0),
        insn(0xb7, 0, 0, 0, 0),
        insn(0xb7, 1, 0, 0, 1),
        insn(0xdb, 10, 1, -8, 0xf1),
        insn(0xb7, 0, 0, 0, 2),
        insn(0x95, 0, 0, 0, 0),
    ];

    const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
        (code as u64)
            | (((dst & 0xf) as u64) << 8)
            | (((src & 0xf) as u64) << 12)
            | ((off as u16 as u64) << 16)
            | ((imm as u32 as u64) << 32)
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> bool {
        // SAFETY: `attr` is a properly sized, zero-padded bpf_attr for `cmd`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr as *mut T,
                std::mem::size_of::<T>() as u32,
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: the fd the kernel just returned, closed once.
        unsafe { libc::close(fd as libc::c_int) };
        true
    }

    fn load_xdp(insns: &[u64], prog_flags: u32) -> bool {
        let license = c"GPL";
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_flags,
            ..ProgLoad::default()
        };
        bpf(BPF_PROG_LOAD, &mut attr)
    }

    fn create_array(map_flags: u32) -> bool {
        let mut attr = MapCreate {
            map_type: BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
            map_flags,
            ..MapCreate::default()
        };
        bpf(BPF_MAP_CREATE, &mut attr)
    }

    /// The probe's answer if the control passes.
    fn compared(control: bool, probe: impl FnOnce() -> bool) -> Option<bool> {
        control.then(probe)
    }

    pub fn xdp_frags_flag() -> Option<bool> {
        compared(load_xdp(&PASS, 0), || load_xdp(&PASS, BPF_F_XDP_HAS_FRAGS))
    }

    pub fn atomics() -> Option<bool> {
        compared(load_xdp(&PASS, 0), || load_xdp(&CMPXCHG, 0))
    }

    pub fn mmapable_array() -> Option<bool> {
        compared(create_array(0), || create_array(BPF_F_MMAPABLE))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(parse("6.1.170"), Some(Version::new(6, 1, 170)));
        assert_eq!(parse("6.1"), None);
        assert_eq!(parse("x.1.2"), None);
        assert!(parse("6.5.255").unwrap() < TCX);
        assert!(parse("6.12.117").unwrap() >= TCX);
        assert_eq!(TCX.to_string(), "6.6.0");
    }

    const MODES: [ConfigXdpMode; 4] = [
        ConfigXdpMode::Auto,
        ConfigXdpMode::Native,
        ConfigXdpMode::Generic,
        ConfigXdpMode::Tc,
    ];

    #[test]
    fn the_kernels_lb_fleets_run() {
        let none = Probes::none();
        // Debian 12's 6.1: everything but tcx; tc mode runs as a cls_bpf filter.
        let debian12 = Version::new(6, 1, 170);
        for mode in MODES {
            let s = check(debian12, mode, &none).unwrap();
            assert!(s.multi_buffer);
            assert_eq!(s.tc_hook, TcHook::ClsBpf);
        }
        // Its 6.12 backport and this machine's 6.18: tcx.
        for v in [Version::new(6, 12, 107), Version::new(6, 18, 0)] {
            assert_eq!(
                check(v, ConfigXdpMode::Tc, &none).unwrap().tc_hook,
                TcHook::Tcx
            );
        }
        // Ubuntu's 5.15: no frags, so the linear build only, and generic mode (the
        // multi-buffer build only) is refused by name.
        let ubuntu = Version::new(5, 15, 0);
        assert!(
            !check(ubuntu, ConfigXdpMode::Native, &none)
                .unwrap()
                .multi_buffer
        );
        let e = check(ubuntu, ConfigXdpMode::Generic, &none).unwrap_err();
        assert_eq!(e.feature, Feature::XdpFrags);
        assert_eq!(
            e.to_string(),
            "xdp_mode = \"generic\" needs XDP multi-buffer (xdp.frags) (Linux 5.18); \
             this kernel is 5.15.0"
        );
        // 5.10 (Debian 11): no atomic compare-and-exchange for the meters.
        let e = check(Version::new(5, 10, 0), ConfigXdpMode::Tc, &none).unwrap_err();
        assert_eq!(e.feature, Feature::Atomics);
        assert!(
            e.to_string()
                .contains("(Linux 5.12); this kernel is 5.10.0"),
            "{e}"
        );
    }

    #[test]
    fn a_probe_overrides_the_version() {
        // A distribution 5.15 with frags backported runs the multi-buffer build…
        let backport = Probes::none().with(Feature::XdpFrags, true);
        let s = check(Version::new(5, 15, 0), ConfigXdpMode::Generic, &backport).unwrap();
        assert!(s.multi_buffer);
        assert_eq!(s.backported, vec![Feature::XdpFrags]);
        // …and a 6.1 built without something is refused though its version has it.
        let stripped = Probes::none().with(Feature::LpmTrie, false);
        let e = check(Version::new(6, 1, 0), ConfigXdpMode::Native, &stripped).unwrap_err();
        assert_eq!(e.feature, Feature::LpmTrie);
        assert!(
            e.to_string().ends_with("and a probe found it missing"),
            "{e}"
        );
    }

    proptest::proptest! {
        /// For every version and mode, by the versions alone: refused exactly when a
        /// feature the mode requires is newer than the kernel, and then the error names
        /// the newest such feature's version or an older missing one; otherwise the
        /// equivalents follow the version.
        #[test]
        fn check_agrees_with_the_table(
            major in 4u32..8, minor in 0u32..25, patch in 0u32..300, m in 0usize..4
        ) {
            let v = Version::new(major, minor, patch);
            let mode = MODES[m];
            match check(v, mode, &Probes::none()) {
                Ok(s) => {
                    proptest::prop_assert!(required(mode).all(|f| v >= f.since()));
                    proptest::prop_assert_eq!(s.multi_buffer, v >= Feature::XdpFrags.since());
                    proptest::prop_assert_eq!(s.tc_hook == TcHook::Tcx, v >= TCX);
                    proptest::prop_assert!(s.backported.is_empty());
                }
                Err(e) => {
                    proptest::prop_assert!(required(mode).any(|f| f == e.feature));
                    proptest::prop_assert!(v < e.feature.since());
                    proptest::prop_assert!(e.feature.equivalent().is_none() || mode == ConfigXdpMode::Generic);
                    let needs = format!("(Linux {}.{})", e.feature.since().major, e.feature.since().minor);
                    let text = e.to_string();
                    let is = format!("this kernel is {v}");
                    proptest::prop_assert!(text.contains(&needs));
                    proptest::prop_assert!(text.contains(&is));
                    proptest::prop_assert!(text.contains(mode.as_str()));
                }
            }
        }

        /// A probe that finds a feature present never makes a kernel refuse more.
        #[test]
        fn probing_present_never_refuses_more(
            major in 4u32..8, minor in 0u32..25, m in 0usize..4, f in 0usize..9
        ) {
            let v = Version::new(major, minor, 0);
            let mode = MODES[m];
            let probed = Probes::none().with(Feature::ALL[f], true);
            if check(v, mode, &Probes::none()).is_ok() {
                proptest::prop_assert!(check(v, mode, &probed).is_ok());
            }
        }
    }

    #[test]
    fn this_kernel_probes_as_its_version_says() {
        // The machine the tests run on (6.18 here, 6.1/6.12 in the guests) has every
        // feature its version lists; a probe that disagreed would be a broken probe.
        let v = running().expect("the running kernel's version");
        let probes = Probes::run();
        assert!(
            probes.get(Feature::XdpFrags).is_some(),
            "the probes could not tell anything: they need root (CAP_BPF, CAP_PERFMON)"
        );
        for f in Feature::ALL {
            if let Some(found) = probes.get(f) {
                assert_eq!(found, v >= f.since(), "{f} on {v}: probe says {found}");
            }
        }
        assert_eq!(
            probes.get(Feature::XdpFrags),
            Some(v >= Feature::XdpFrags.since())
        );
        assert_eq!(
            probes.get(Feature::Atomics),
            Some(v >= Feature::Atomics.since())
        );
        assert_eq!(probes.get(Feature::MmapableArray), Some(true));
    }
}
