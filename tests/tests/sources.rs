//! The per-source limit under source churn, through BPF_PROG_TEST_RUN: the real program
//! in the real kernel, one crafted frame per run.
//!
//! - A throttled source stays throttled whatever the churn of other sources: it never
//!   gets more than `burst + rate × elapsed` frames through. The per-source LRU of earlier
//!   versions failed this once the churn between two of its frames evicted its bucket
//!   (which then came back full); the table prints, per churn level, what it got.
//! - Well-behaved sources are never limited by collisions at the documented sizing.
//! - The aggregate bucket is what it was: exactly `burst` frames of a rule pass however
//!   many sources they come from, and frames it refuses cost their sources nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{net::Ipv4Addr, time::Instant};

use limiter_tests::{
    fixture::{self, Loaded},
    frame::{with_ipv4_src, FrameBuilder},
    tools,
};
use limiter_user::host::object::Variant;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

const DST: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// The throttled source; churn comes from the rest of 198.18.0.0/15.
const THROTTLED: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 254);
/// Sources for churn: 198.18.0.0 up, 2^17 - 2 of them (wrapping).
const CHURN_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const CHURN_SPAN: u32 = (1 << 17) - 2;

fn frame(src: Ipv4Addr) -> Vec<u8> {
    FrameBuilder::ipv4(src, DST).udp(1, 53).build()
}

/// Sends one frame per call, rewriting only the source.
struct Sender<'a> {
    loaded: &'a Loaded,
    frame: Vec<u8>,
    next_churn: u32,
}

impl<'a> Sender<'a> {
    fn new(loaded: &'a Loaded) -> Self {
        Sender {
            loaded,
            frame: frame(THROTTLED),
            next_churn: 0,
        }
    }

    fn send(&mut self, src: Ipv4Addr) -> u32 {
        with_ipv4_src(&mut self.frame, src).unwrap();
        self.loaded.run(&self.frame).expect("test run")
    }

    /// `n` frames, each from the next churn source.
    fn churn(&mut self, n: u32) {
        for _ in 0..n {
            let src = Ipv4Addr::from(CHURN_BASE + self.next_churn);
            self.next_churn = (self.next_churn + 1) % CHURN_SPAN;
            self.send(src);
        }
    }
}

/// What the throttled source got at one churn level.
#[derive(Debug)]
struct ChurnRow {
    churn_per_probe: u32,
    probes: u32,
    passed: u64,
    allowed: u64,
    churn_per_second: f64,
}

/// Per source: 1 frame/s, burst 1, in a structure sized for 4096 sources. The
/// throttled source sends one frame after every `churn` frames from other sources.
fn throttled_source_under_churn(churn: u32, probes: u32) -> ChurnRow {
    let config = format!(
        "max_sources = 4096\n[[rules]]\nname = \"guarded\"\ndst = \"{DST}/32\"\n\
         [rules.per_source]\nrate = 1\nburst = 1\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut sender = Sender::new(&loaded);
    let started = Instant::now();
    let mut passed = u64::from(sender.send(THROTTLED) == XDP_PASS);
    for _ in 0..probes {
        sender.churn(churn);
        passed += u64::from(sender.send(THROTTLED) == XDP_PASS);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // burst + rate × elapsed, rounded down (one more frame conforms per whole second).
    let allowed = 1 + elapsed.floor() as u64;
    ChurnRow {
        churn_per_probe: churn,
        probes,
        passed,
        allowed,
        churn_per_second: f64::from(churn) * f64::from(probes) / elapsed,
    }
}

#[test]
fn a_throttled_source_stays_throttled_whatever_the_churn() {
    let rows: Vec<ChurnRow> = [0, 64, 512, 2048, 3072, 3584, 4096, 8192, 32768]
        .into_iter()
        .map(|churn| throttled_source_under_churn(churn, 8))
        .collect();
    eprintln!("churn/probe  probes  churn/s     passed  allowed");
    for r in &rows {
        eprintln!(
            "{:>11}  {:>6}  {:>10.0}  {:>6}  {:>7}",
            r.churn_per_probe, r.probes, r.churn_per_second, r.passed, r.allowed
        );
    }
    let broken: Vec<&ChurnRow> = rows.iter().filter(|r| r.passed > r.allowed).collect();
    assert!(
        broken.is_empty(),
        "churn bought a throttled source frames past its limit: {broken:#?}"
    );
}

/// 256 sources, each sending half its burst twice over (2 frames of a burst of 4, at 1
/// frame/s), with a flood of 2048 spoofed single-frame sources between the two rounds,
/// in a sketch of 65536 cells per row: the documented sizing (README, per-source
/// limits) gives each a false-limit probability far below 1e-6, so none may be limited.
#[test]
fn well_behaved_sources_are_not_limited_by_collisions() {
    let config = format!(
        "max_sources = 65536\n[[rules]]\nname = \"guarded\"\ndst = \"{DST}/32\"\n\
         [rules.per_source]\nrate = 1\nburst = 4\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut sender = Sender::new(&loaded);
    let well_behaved: Vec<Ipv4Addr> = (0..256u32)
        .map(|i| Ipv4Addr::from(u32::from_be_bytes([198, 19, 128, 0]) + i))
        .collect();
    let mut refused = Vec::new();
    for round in 0..2 {
        for &src in &well_behaved {
            if sender.send(src) != XDP_PASS {
                refused.push((round, src));
            }
        }
        sender.churn(2048);
    }
    assert!(
        refused.is_empty(),
        "well-behaved sources limited: {refused:?}"
    );
}

/// The aggregate admits exactly its burst whatever sources the frames come from, and a
/// frame it refuses is refunded to its source: a source refused by the aggregate alone
/// still has its whole per-source burst once the aggregate has room again.
#[test]
fn the_aggregate_bucket_is_unchanged() {
    let config = format!(
        "[[rules]]\nname = \"both\"\ndst = \"{DST}/32\"\nrate = 1\nburst = 10\n\
         [rules.per_source]\nrate = 1\nburst = 2\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut sender = Sender::new(&loaded);
    let verdicts: Vec<u32> = (0..40u32)
        .map(|i| sender.send(Ipv4Addr::from(CHURN_BASE + i)))
        .collect();
    let passed = verdicts.iter().filter(|&&v| v == XDP_PASS).count();
    assert_eq!(passed, 10, "the aggregate's burst: {verdicts:?}");
    assert!(verdicts[..10].iter().all(|&v| v == XDP_PASS));
    assert!(verdicts[10..].iter().all(|&v| v == XDP_DROP));
    let c = loaded.snapshot().unwrap().rules["both"];
    assert_eq!((c.passed_packets, c.dropped_packets), (10, 30));

    // Same, with the aggregate's burst larger than the per-source one: a source's third
    // frame is refused by its own limit, whatever the aggregate holds.
    let config = format!(
        "[[rules]]\nname = \"both\"\ndst = \"{DST}/32\"\nrate = 1\nburst = 100\n\
         [rules.per_source]\nrate = 1\nburst = 2\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut sender = Sender::new(&loaded);
    let got: Vec<u32> = (0..3).map(|_| sender.send(THROTTLED)).collect();
    assert_eq!(got, [XDP_PASS, XDP_PASS, XDP_DROP]);
    let c = loaded.snapshot().unwrap().rules["both"];
    assert_eq!((c.passed_packets, c.dropped_packets), (2, 1));

    // The refund: aggregate 10/s burst 1, per source 1/s burst 2. The second frame is
    // admitted by the source's cells, refused by the aggregate, and refunded; 150 ms
    // later the aggregate has a token again and the source still one of its two (without
    // the refund its cells would be a whole second in debt: refused).
    let config = format!(
        "[[rules]]\nname = \"both\"\ndst = \"{DST}/32\"\nrate = 10\nburst = 1\n\
         [rules.per_source]\nrate = 1\nburst = 2\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut sender = Sender::new(&loaded);
    assert_eq!(sender.send(THROTTLED), XDP_PASS, "first frame");
    assert_eq!(
        sender.send(THROTTLED),
        XDP_DROP,
        "second: the aggregate is empty"
    );
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert_eq!(
        sender.send(THROTTLED),
        XDP_PASS,
        "third: the aggregate refilled and the refused frame was refunded to the source"
    );
}

/// `bytes_memlock` of one map, as bpftool reports it.
fn memlock_of_map(id: u32) -> (String, u64) {
    let map = tools::bpftool_map_show_id(id).unwrap();
    (map.name, map.bytes_memlock)
}

/// This process's memory cgroup usage (v1 or v2), for the kernel's own accounting.
fn cgroup_memory() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = match controllers {
            "memory" => format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"),
            "" => format!("/sys/fs/cgroup{path}/memory.current"),
            _ => continue,
        };
        if let Ok(text) = std::fs::read_to_string(&file) {
            return text.trim().parse().ok();
        }
    }
    None
}

/// The sketch's memory and the whole program's at `max_sources` 1 M and 16 M, from
/// bpftool's memlock of every map the program's builds use and from the memory
/// cgroup's usage before and after loading; beside it, the per-source LRU of earlier
/// versions at the same sizes (the bench's `cand_lru` map). Prints the README's table;
/// checks the sketch costs ROWS × 8 bytes per cell (plus at most a page).
#[test]
fn memory_per_source_at_1m_and_16m() {
    use limiter_common::sketch;
    use limiter_user::{
        attach::program::{LoadOptions, Program},
        host::object::{Variant, BASELINE_OBJECT},
    };
    limiter_tests::netns::require_root().unwrap();
    eprintln!("max_sources  sketch memlock  program memlock  cgroup delta  LRU memlock");
    for max_sources in [1u32 << 20, 1 << 24] {
        let before = cgroup_memory();
        let program = Program::load(&LoadOptions {
            pin_dir: None,
            max_sources,
            handoff_array: None,
        })
        .expect("loading the program");
        let after = cgroup_memory();
        let mut ids: Vec<u32> = Variant::ALL
            .iter()
            .flat_map(|&v| {
                program
                    .info(v)
                    .expect("program info")
                    .map_ids()
                    .expect("map ids")
                    .unwrap_or_default()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let maps: Vec<(String, u64)> = ids.into_iter().map(memlock_of_map).collect();
        let total: u64 = maps.iter().map(|(_, b)| b).sum();
        let sketch_bytes = maps
            .iter()
            .find(|(n, _)| n == "SRC_SKETCH")
            .map(|(_, b)| *b)
            .expect("SRC_SKETCH among the program's maps");
        let cells = u64::from(sketch::cells_for(max_sources));
        // From Linux 6.4 memlock is what the array allocated; before, an estimate of
        // round_up(key + value, 8) bytes an entry, rounded up to a page (16 here).
        let estimate = (cells * 16).div_ceil(4096) * 4096;
        assert!(
            (sketch_bytes >= cells * 8 && sketch_bytes <= cells * 8 + 2 * 4096)
                || sketch_bytes == estimate,
            "SRC_SKETCH memlock {sketch_bytes} for {cells} cells: neither the allocation \
             (8 bytes a cell) nor the pre-6.4 estimate ({estimate})"
        );
        drop(program);

        let mut baseline = aya::EbpfLoader::new()
            .map_max_entries("CAND_LRU", max_sources)
            .load(BASELINE_OBJECT)
            .expect("loading the baseline object");
        let lru = baseline
            .take_map("CAND_LRU")
            .expect("CAND_LRU in the baseline object");
        let aya::maps::Map::LruHashMap(data) = &lru else {
            panic!("CAND_LRU is not an LRU hash map");
        };
        let (_, lru_bytes) = memlock_of_map(data.info().expect("CAND_LRU info").id());
        let per_source = |bytes: u64| bytes as f64 / f64::from(max_sources);
        eprintln!(
            "{max_sources:>11}  {sketch_bytes:>14}  {total:>15}  {:>12}  {lru_bytes:>11}",
            match (before, after) {
                (Some(b), Some(a)) => (a as i64 - b as i64).to_string(),
                _ => "n/a".into(),
            }
        );
        eprintln!(
            "             per source: sketch {:.1} B, LRU {:.1} B",
            per_source(sketch_bytes),
            per_source(lru_bytes)
        );
    }
}

/// An LRU hash named `SRC_BUCKETS` with the earlier versions' layout (SourceKey →
/// Bucket), created as the earlier daemon's loader made it.
fn earlier_versions_lru(entries: u32) -> aya::maps::MapData {
    const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
    let map = aya_obj::Map::new_from_params(
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<limiter_common::abi::SourceKey>() as u32,
        size_of::<limiter_common::abi::Bucket>() as u32,
        entries,
        0,
    );
    aya::maps::MapData::create(map, "SRC_BUCKETS", None).expect("BPF_MAP_CREATE")
}

/// A daemon upgrade over the pins of a version with the per-source LRU: a source its
/// LRU bucket throttles stays throttled in the sketch (its state is carried over), and
/// the old map's pin is removed. Without the carry-over the upgraded program would give
/// the source a fresh burst: its frame would pass.
#[test]
fn an_upgrade_carries_the_lru_state_into_the_sketch() {
    use aya::programs::{TestRun, TestRunOptions};
    use limiter_common::abi::{map_name, Bucket, SourceKey};
    use limiter_user::{
        attach::program::{LoadOptions, Program},
        config::Config,
        daemon::apply_rules,
    };
    limiter_tests::netns::require_root().unwrap();
    let pins = limiter_tests::scenario::PinDir::new();
    struct Cleanup<'a>(&'a std::path::Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = Cleanup(&pins.path);
    let config_text = format!(
        "max_sources = 4096\n[[rules]]\nname = \"guarded\"\ndst = \"{DST}/32\"\n\
         [rules.per_source]\nrate = 1\nburst = 1\n"
    );
    let config = Config::parse(&config_text, std::path::Path::new("<test>")).unwrap();
    let opts = LoadOptions {
        pin_dir: Some(pins.path.clone()),
        max_sources: config.max_sources,
        handoff_array: None,
    };
    // The running version: its rules pinned, and its LRU with the throttled source's
    // bucket deep in debt (its burst of 1 long spent).
    let slot = {
        let mut program = Program::load(&opts).expect("loading the program (root, bpffs)");
        let mut maps = program.maps().unwrap();
        let table = apply_rules(&mut maps, &config).unwrap();
        table.slots["guarded"]
    };
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&THROTTLED.octets());
    let key = SourceKey::masked(slot, 4, &src, 32, 128);
    let now_ns = limiter_fleet::clock::monotonic_ns();
    // Ten minutes in debt: still in debt after the second load, however slow the
    // verifier (under TCG emulation it takes many seconds).
    let debt = limiter_common::gcra::ticks_from_ns(now_ns + 600_000_000_000);
    let lru = earlier_versions_lru(4096);
    lru.pin(pins.path.join(map_name::SRC_BUCKETS)).unwrap();
    let mut lru: aya::maps::HashMap<_, SourceKey, Bucket> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(lru)).unwrap();
    lru.insert(key, Bucket { tat: debt }, 0).unwrap();
    drop(lru);

    // The upgrade: the same pins, this version's program, its first install (which
    // knows each rule's part of the sketch).
    let mut program = Program::load(&opts).expect("loading over the pins");
    let mut maps = program.maps().unwrap();
    apply_rules(&mut maps, &config).unwrap();
    assert!(
        !pins.path.join(map_name::SRC_BUCKETS).exists(),
        "the earlier version's LRU pin is still there"
    );
    let rule = maps.live_rules().unwrap()[&slot];
    let cells = maps.source_cells(&key, &rule).unwrap().unwrap();
    assert!(
        cells.iter().all(|&(_, tat)| tat == debt),
        "the cells do not hold the carried state: {cells:?}, expected {debt}"
    );
    let frame = frame(THROTTLED);
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(&frame);
    let verdict = program.xdp().unwrap().test_run(opts).unwrap().return_value;
    assert_eq!(
        verdict, XDP_DROP,
        "the throttled source got a fresh burst at the upgrade"
    );
}

/// Collisions as the sketch defines them, in the kernel and in `explain`: in a sketch of
/// 1024 cells a row, with a throttled source A, a source B sharing one of A's cells is
/// decided by its other cell (the least advanced) and passes, while a source C sharing
/// both is limited: the false limit the formula counts, which `explain` foretells. An
/// all-cells-must-admit sketch would refuse B too.
#[test]
fn one_shared_cell_limits_nobody_two_do_and_explain_says_so() {
    use std::net::{IpAddr, Ipv6Addr};

    use limiter_common::{abi::SourceKey, sketch};
    use limiter_user::{
        config::Proto,
        observe::explain::{explain, ExplainQuery},
    };
    const DST6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    let config = format!(
        "max_sources = 1024\n[[rules]]\nname = \"guarded\"\ndst = \"{DST6}/128\"\n\
         [rules.per_source]\nrate = 1\nburst = 1\nprefix_v6 = 128\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let slot = loaded.table.slots["guarded"];
    let meta = loaded.maps.sketch_meta_as_is().unwrap();
    let rule = loaded.maps.live_rules().unwrap()[&slot];
    let limit = rule.per_source;
    let source = |i: u64| {
        Ipv6Addr::new(
            0x2001,
            0xdb8,
            1,
            0,
            (i >> 48) as u16,
            (i >> 32) as u16,
            (i >> 16) as u16,
            i as u16,
        )
    };
    let cells = |a: Ipv6Addr| {
        sketch::cells_of(
            &meta,
            rule.sketch_region,
            &SourceKey::masked(slot, 6, &a.octets(), 32, 128),
            &limit,
        )
    };
    let a = source(0);
    let of_a = cells(a);
    let b = (1..)
        .map(source)
        .find(|&s| {
            let c = cells(s);
            c[0] == of_a[0] && c[1] != of_a[1]
        })
        .unwrap();
    // 2^20 pairs of cells: found within a few million tries.
    let c = (1..50_000_000)
        .map(source)
        .find(|&s| cells(s) == of_a)
        .expect("a source sharing both of A's cells within 5e7 addresses");

    let run = |src: Ipv6Addr| {
        let f = FrameBuilder::ipv6(src, DST6).udp(1, 53).build();
        loaded.run(&f).expect("test run")
    };
    let foretold = |src: Ipv6Addr| {
        let query = ExplainQuery {
            src: IpAddr::V6(src),
            dst: IpAddr::V6(DST6),
            dst_port: Some(53),
            proto: Proto::Udp,
            frame_len: 64,
            syn: false,
        };
        let e = explain(&loaded.table, &loaded.maps, &query, |_, _| (0, 0)).unwrap();
        e.per_source.expect("a per-source view").conforms
    };
    assert_eq!(run(a), XDP_PASS, "A's first frame");
    assert_eq!(run(a), XDP_DROP, "A is throttled");
    assert!(foretold(b), "explain: B's other cell is free");
    assert!(!foretold(c), "explain: both of C's cells are A's");
    assert_eq!(
        run(b),
        XDP_PASS,
        "B shares one cell with A: its other cell decides"
    );
    assert_eq!(
        run(c),
        XDP_DROP,
        "C shares both cells with A: limited by collision"
    );
}

/// Rules meter their sources in parts of the sketch of their own: a flood of new sources
/// on a strict rule (10/s, burst 5: each admitted frame advances a cell by 100 ms) fills
/// every cell of its part, and a well-behaved source of a lenient rule (1000/s, burst
/// 100: it tolerates 99 ms) loses nothing. With every rule in the whole row, as before
/// regions, the flood's cells were the good source's too and it was refused.
#[test]
fn a_flood_on_one_rule_costs_another_rules_sources_nothing() {
    use limiter_common::sketch;
    const GOOD_DST: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);
    const GOOD: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 253);
    let config = format!(
        "max_sources = 1024\n\
         [[rules]]\nname = \"flooded\"\ndst = \"{DST}/32\"\n\
         [rules.per_source]\nrate = 10\nburst = 5\n\
         [[rules]]\nname = \"good\"\ndst = \"{GOOD_DST}/32\"\n\
         [rules.per_source]\nrate = 1000\nburst = 100\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let rules = loaded.maps.live_rules().unwrap();
    let (flooded, good) = (
        rules[&loaded.table.slots["flooded"]],
        rules[&loaded.table.slots["good"]],
    );
    let width_mask = loaded.maps.sketch_meta_as_is().unwrap().width_mask;
    let (a, b) = (
        sketch::region_span(flooded.sketch_region, width_mask),
        sketch::region_span(good.sketch_region, width_mask),
    );
    assert!(
        a.0 + a.1 < b.0 || b.0 + b.1 < a.0,
        "the rules' parts of the sketch overlap: {a:?} and {b:?}"
    );

    // 20 new sources per cell of the flooded rule's part: every cell is exhausted.
    let mut sender = Sender::new(&loaded);
    sender.churn(20 * 2048);
    let good_frame = FrameBuilder::ipv4(GOOD, GOOD_DST).udp(1, 53).build();
    let mut refused = 0;
    for _ in 0..50 {
        if loaded.run(&good_frame).expect("test run") != XDP_PASS {
            refused += 1;
        }
    }
    assert_eq!(
        refused, 0,
        "the flood on another rule limited the good source"
    );
    // The flood itself is held: its part of the sketch is exhausted.
    let mut held = 0;
    for i in 0..200u32 {
        let f = frame(Ipv4Addr::from(CHURN_BASE + CHURN_SPAN - 1 - i));
        if loaded.run(&f).expect("test run") == XDP_DROP {
            held += 1;
        }
    }
    assert!(
        held > 150,
        "the flood's own part did not fill: only {held} of 200 new sources refused"
    );
}

/// A per-source limit standing aside (`RULE_SOURCES_ASIDE`, which the daemon sets while a
/// flood saturates the rule's cells and `on_saturation = "stand-aside"`): a frame it
/// refuses passes on to the aggregate, which keeps holding; the source's cells are
/// charged nothing for it (they evolve as when the limit enforces, so the daemon's
/// estimate stays valid); clearing the flag enforces again.
#[test]
fn a_per_source_limit_standing_aside_leaves_frames_to_the_aggregate() {
    use limiter_common::abi::{SourceKey, RULE_SOURCES_ASIDE};
    let config = format!(
        "max_sources = 1024\n[[rules]]\nname = \"flooded\"\ndst = \"{DST}/32\"\n\
         rate = 1\nburst = 3\n[rules.per_source]\nrate = 1\nburst = 1\n"
    );
    let mut loaded =
        fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let slot = loaded.table.slots["flooded"];
    let a = Ipv4Addr::new(198, 18, 7, 7);
    let f = frame(a);
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&a.octets());
    let key = SourceKey::masked(slot, 4, &src, 32, 128);
    let cells = |loaded: &Loaded| {
        let rule = loaded.maps.live_rule(slot).unwrap();
        loaded.maps.source_cells(&key, &rule).unwrap().unwrap()
    };
    let set_aside = |loaded: &mut Loaded, aside: bool| {
        let mut table = loaded.table.clone();
        for (_, rule) in &mut table.rules {
            if aside {
                rule.flags |= RULE_SOURCES_ASIDE;
            } else {
                rule.flags &= !RULE_SOURCES_ASIDE;
            }
        }
        loaded.maps.install(&table).unwrap();
    };
    assert_eq!(loaded.run(&f).unwrap(), XDP_PASS, "the source's burst");
    assert_eq!(
        loaded.run(&f).unwrap(),
        XDP_DROP,
        "over its per-source limit"
    );
    let before = cells(&loaded);
    set_aside(&mut loaded, true);
    // The aggregate's burst of 3 had one frame taken: two more pass, then it refuses.
    assert_eq!(
        loaded.run(&f).unwrap(),
        XDP_PASS,
        "standing aside: the aggregate admits"
    );
    assert_eq!(
        loaded.run(&f).unwrap(),
        XDP_PASS,
        "standing aside: the aggregate admits"
    );
    assert_eq!(
        loaded.run(&f).unwrap(),
        XDP_DROP,
        "the aggregate keeps holding"
    );
    assert_eq!(
        cells(&loaded),
        before,
        "frames the per-source limit refused charged its cells"
    );
    set_aside(&mut loaded, false);
    assert_eq!(loaded.run(&f).unwrap(), XDP_DROP, "enforcing again");
}
