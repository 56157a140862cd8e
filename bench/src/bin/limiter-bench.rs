//! limiter-bench (`cargo xtask bench`), in two parts:
//!
//! 1. **prog-test-run**: what the XDP program costs per 64-byte frame under
//!    BPF_PROG_TEST_RUN, as a ratio to the trivial `baseline_pass` program measured in the
//!    same run with the same method (this file; `target/bench/prog-test-run.md`).
//! 2. **end to end** over a veth pair (the `limiter_bench` library): drop rate vs plain
//!    XDP_DROP, CPU time per frame vs nftables, admitted vs configured rate, with plots
//!    (`target/bench/report.md`, `admitted-vs-offered.svg`, `burst.svg`).
//!
//! 3. **allocator capacity** (the `allocator` module of the library): host reports a
//!    second one allocator's state handles on one core, as a ratio to what a fleet of
//!    each shape requires (`target/bench/allocator-capacity.md`; needs no root).
//!
//! Arguments select parts: `prog-test-run`, `sharing`, `drop-rate`, `cpu-cost`,
//! `accuracy`, `flood`, `allocator-capacity`; none runs them all. The run fails if any end-to-end measurement failed its checks (after
//! writing the report, which says which and why).
//!
//! Part 1 uses two methods, never mixed in one ratio:
//! - **repeat**: one call runs the same frame `REPEAT` times; the kernel reports the
//!   mean ns per run. Rounds are interleaved across scenarios; the median round counts.
//! - **per frame**: frames that must differ (a new source each) take one call each
//!   (`repeat = 1`); the kernel-measured duration of such a call includes the test
//!   harness's own clock read, so `baseline_pass` is measured the same way for them.
//!
//! Every verdict is checked, and so are the counters that prove a scenario took the path
//! it is named after (e.g. every per-source frame found the sketch set up, and a throttled
//! source is still throttled after churn).
//! Output: a table on stdout and the same as Markdown in `target/bench/prog-test-run.md`.
//!
//! Run as root (but for `allocator-capacity` alone): `cargo run --release -p limiter-bench
//! --bin limiter-bench [-- PART...]`.

use std::{
    fmt::Write as _,
    fs, io,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use aya::{
    maps::Array,
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
    Ebpf, EbpfLoader,
};
use limiter_bench::{self as bench, report};
use limiter_common::sketch::{self, SketchMeta};
use limiter_tests::{
    fixture::{self, Loaded, Snapshot},
    frame::{with_ipv4_src, FrameBuilder, TCP_ACK},
};
use limiter_user::{
    attach::program::{LoadOptions, Program},
    config::MAX_MAX_SOURCES,
    host::object::{Variant, BASELINE_OBJECT},
};

/// The BPF_PROG_TEST_RUN report, next to the end-to-end one.
const PROG_TEST_RUN_MD: &str = "prog-test-run.md";
/// The `allocator-capacity` part's report.
const ALLOCATOR_CAPACITY_MD: &str = "allocator-capacity.md";
/// The `sharing` part alone.
const SHARING_MD: &str = "sharing.md";
/// Frame length the program sees (no FCS).
const FRAME_LEN: usize = 64;
/// Runs per BPF_PROG_TEST_RUN call in the repeat method.
const REPEAT: u32 = 1_000_000;
/// Measured rounds of the repeat method (odd: the median is one round).
const REPEAT_ROUNDS: usize = 7;
/// Calls per scenario and round in the per-frame method.
const FRAMES_PER_ROUND: usize = 10_000;
/// Measured rounds of the per-frame method (odd).
const FRAME_ROUNDS: usize = 5;
/// `max_sources` of the program that measures a new source per frame (the default).
const LARGE_SOURCES: u32 = 1 << 20;
/// `max_sources` of the program that measures churn through a small sketch.
const SMALL_SOURCES: u32 = 4096;
/// The target the bench holds the hot path to, as a multiple of `baseline_pass`.
const HOT_PATH_TARGET: f64 = 4.0;

/// Test addresses: 198.18.0.0/15, 2^17 of them.
const TEST_NET: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const TEST_NET_SIZE: u32 = 1 << 17;

// Every frame of the new-source scenario must come from a source never seen before.
const _: () = assert!(FRAMES_PER_ROUND * (FRAME_ROUNDS + 1) <= NEW_SOURCES as usize);

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

const DST_UNMATCHED: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 200);
const DST_HOT_PASS: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const DST_HOT_DROP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
const DST_PER_SOURCE: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 3);
const DST_PRECISE_DROP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 4);
const DST_LINEAR_DROP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 5);
const DST_TC_DROP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 6);
const DST_FRAGMENTS: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 7);
/// The Identification of the fragmented datagram the fragment rows send.
const FRAGMENT_ID: u16 = 0x4242;
/// Rate of the `precise-drop` rule: its burst of 1 is 1 ms, below the tick clock's
/// minimum tolerance, so it reads the precise clock.
const PRECISE_RATE: u64 = 1000;
const DST_PORT: u16 = 443;

/// Rules of the program behind scenarios 2–5. Per-source limits are 1/s with a burst of
/// 1: a source's first frame passes, a second one within the second drops, so a PASS
/// proves the source was new (or evicted).
fn config(max_sources: u32) -> String {
    format!(
        r#"max_sources = {max_sources}

[[rules]]
name = "hot-pass"
dst = "{DST_HOT_PASS}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = 1_000_000_000
burst = 1_000_000_000

[[rules]]
name = "hot-drop"
dst = "{DST_HOT_DROP}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = 1
burst = 1

[[rules]]
name = "precise-drop"
dst = "{DST_PRECISE_DROP}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = {PRECISE_RATE}
burst = 1

[[rules]]
name = "linear-drop"
dst = "{DST_LINEAR_DROP}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = 1
burst = 1

[[rules]]
name = "tc-drop"
dst = "{DST_TC_DROP}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = 1
burst = 1

[[rules]]
name = "frag-pass"
dst = "{DST_FRAGMENTS}/32"
dst_port = {DST_PORT}
proto = "tcp"
rate = 1_000_000_000
burst = 1_000_000_000

[[rules]]
name = "per-source"
dst = "{DST_PER_SOURCE}/32"
dst_port = {DST_PORT}
proto = "tcp"
[rules.per_source]
rate = 1
burst = 1
"#
    )
}

fn main() -> Result<()> {
    let parts = Parts::from_args(std::env::args().skip(1))?;
    if parts.needs_root() {
        limiter_tests::netns::require_root()?;
    }
    let started = Instant::now();
    let dir = bench_dir()?;
    let header = Header::read(None)?;
    if parts.allocator_capacity {
        run_allocator_capacity(&dir, &header)?;
    }
    let prog_test_run = if parts.prog_test_run {
        run_prog_test_run(&dir, false)?;
        Some(PROG_TEST_RUN_MD.to_string())
    } else {
        None
    };
    if parts.sharing && !parts.prog_test_run {
        run_prog_test_run(&dir, true)?;
    }
    if parts.flood {
        run_flood(&dir, &header)?;
    }
    if !parts.end_to_end.any() {
        return Ok(());
    }
    let results = bench::run(parts.end_to_end)?;
    let context = report::Context {
        command: parts.command(),
        kernel: header.kernel,
        cpu_model: header.cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        elapsed_s: started.elapsed().as_secs_f64(),
        prog_test_run,
    };
    let written = report::write(&dir, &context, &results)?;
    println!("\n{}", written.markdown);
    println!("targets:");
    for line in &written.targets {
        println!("  {line}");
    }
    println!("\nwritten to {}", dir.join(report::REPORT).display());
    ensure!(
        written.invalid == 0,
        "{} measurement(s) failed their checks (INVALID in the report)",
        written.invalid
    );
    Ok(())
}

/// Which parts to run: every one without arguments, else those named.
struct Parts {
    prog_test_run: bool,
    /// Only the rows of the ways of sharing the hook (also part of prog-test-run).
    sharing: bool,
    /// The spoofed-source flood (`flood.md`).
    flood: bool,
    /// The allocator's reports/s on one core (`allocator-capacity.md`).
    allocator_capacity: bool,
    end_to_end: bench::Parts,
    named: Vec<String>,
}

const PART_NAMES: [&str; 7] = [
    "prog-test-run",
    "sharing",
    "drop-rate",
    "cpu-cost",
    "accuracy",
    "flood",
    "allocator-capacity",
];

impl Parts {
    fn from_args(args: impl Iterator<Item = String>) -> Result<Parts> {
        let named: Vec<String> = args.collect();
        if named.is_empty() {
            return Ok(Parts {
                prog_test_run: true,
                sharing: false,
                flood: true,
                allocator_capacity: true,
                end_to_end: bench::Parts::all(),
                named,
            });
        }
        let mut parts = Parts {
            prog_test_run: false,
            sharing: false,
            flood: false,
            allocator_capacity: false,
            end_to_end: bench::Parts::default(),
            named: named.clone(),
        };
        for name in &named {
            match name.as_str() {
                "prog-test-run" => parts.prog_test_run = true,
                "sharing" => parts.sharing = true,
                "flood" => parts.flood = true,
                "allocator-capacity" => parts.allocator_capacity = true,
                "drop-rate" => parts.end_to_end.drop_rate = true,
                "cpu-cost" => parts.end_to_end.cpu_cost = true,
                "accuracy" => parts.end_to_end.accuracy = true,
                other => anyhow::bail!(
                    "unknown part {other:?}; usage: limiter-bench [{}]... (none = all)",
                    PART_NAMES.join("|")
                ),
            }
        }
        Ok(parts)
    }

    /// Every part but the allocator's loads programs or creates interfaces.
    fn needs_root(&self) -> bool {
        self.prog_test_run || self.sharing || self.flood || self.end_to_end.any()
    }

    fn command(&self) -> String {
        if self.named.is_empty() {
            "cargo xtask bench".to_string()
        } else {
            format!(
                "cargo run --release -p limiter-bench --bin limiter-bench -- {}",
                self.named.join(" ")
            )
        }
    }
}

/// Sizes of the per-source structure the flood runs against: smaller than the flood's
/// IPv4 sources alone (131,072), and the default.
const FLOOD_SIZES: [u32; 2] = [16_384, 1 << 20];

/// The `flood` part: `flood.md` in `dir`, two rounds of each size.
fn run_flood(dir: &Path, header: &Header) -> Result<()> {
    let pair = bench::veth_pair()?;
    let runs = bench::flood::measure(&pair, &FLOOD_SIZES, 2)?;
    let two_cpus = bench::flood::measure_two_cpus(&pair, &FLOOD_SIZES, 2)?;
    let markdown = bench::flood::markdown(&runs, &two_cpus, header.kernel.trim());
    print!("\n{markdown}");
    let path = dir.join("flood.md");
    fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("\nwritten to {}", path.display());
    Ok(())
}

/// The `allocator-capacity` part: `allocator-capacity.md` in `dir`. The warm-ups run on
/// every CPU; the timing pinned to one, which it gets back afterwards.
fn run_allocator_capacity(dir: &Path, header: &Header) -> Result<()> {
    use bench::allocator::{self, Plan, SHAPES};
    let all_cpus = current_affinity()?;
    let mut cpu = None;
    let results = allocator::measure_all(&SHAPES, Plan::BENCH, || {
        cpu = Some(pin_to_current_cpu()?);
        Ok(())
    });
    set_affinity(&all_cpus)?;
    let results = results?;
    let machine = format!(
        "kernel {}, CPU {} (timed on CPU {})",
        header.kernel,
        header.cpu_model,
        cpu.map_or_else(|| "none".to_string(), |c| c.to_string())
    );
    let markdown = allocator::markdown(&results, Plan::BENCH, &machine);
    print!("\n{markdown}");
    let path = dir.join(ALLOCATOR_CAPACITY_MD);
    fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("\nwritten to {}", path.display());
    Ok(())
}

/// The BPF_PROG_TEST_RUN part: a table on stdout and `prog-test-run.md` in `dir`
/// (`sharing_only`: the rows of the ways of sharing the hook, in `sharing.md`). Runs
/// pinned to one CPU; the end-to-end part that follows gets every CPU back.
fn run_prog_test_run(dir: &Path, sharing_only: bool) -> Result<()> {
    let all_cpus = current_affinity()?;
    let cpu = pin_to_current_cpu()?;
    let header = Header::read(Some(cpu))?;

    let mut baselines = load_baselines()?;
    load_xdp(&mut baselines, "baseline_pass")?;
    load_xdp(&mut baselines, "baseline_drop")?;
    load_tc(&mut baselines, "baseline_tc_drop")?;
    let (verifier, mut rows, name) = if sharing_only {
        let small = load_limiter(SMALL_SOURCES)?;
        let verifier = VerifierCount {
            max_sources: SMALL_SOURCES,
            instructions: small.program.verified_instructions(),
            failures: Vec::new(),
        };
        let rows = handoff_scenarios(&baselines, &small)?;
        (verifier, rows, SHARING_MD)
    } else {
        let verifier = verifier_count()?;
        let large = load_limiter(LARGE_SOURCES)?;
        let small = load_limiter(SMALL_SOURCES)?;
        let mut rows = repeat_scenarios(&baselines, &large)?;
        rows.extend(per_frame_scenarios(&baselines, &large, &small)?);
        rows.extend(handoff_scenarios(&baselines, &large)?);
        rows.extend(sampling_scenarios(&baselines)?);
        (verifier, rows, PROG_TEST_RUN_MD)
    };
    let note = match dispatcher_scenarios(&baselines) {
        Ok(dispatcher) => {
            rows.extend(dispatcher);
            None
        }
        Err(why) => Some(format!(
            "the libxdp dispatcher rows are missing: {why:#} (on a kernel that accepts \
             freplace, e.g. `cargo xtask bench --kernel 6.1 -- sharing`)"
        )),
    };

    let mut report = render(&header, &verifier, &rows);
    if let Some(note) = note {
        let _ = writeln!(report.text, "{note}");
        let _ = writeln!(report.markdown, "- {note}");
    }
    print!("{}", report.text);
    let path = dir.join(name);
    fs::write(&path, &report.markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("\nwritten to {}\n", path.display());
    set_affinity(&all_cpus)
}

// ---------------------------------------------------------------------------------------
// Running programs

/// The limiter with the bench rules and a per-source map of `max_sources`.
fn load_limiter(max_sources: u32) -> Result<Loaded> {
    fixture::load(&config(max_sources))
        .with_context(|| format!("loading limiter with max_sources {max_sources}"))
}

/// Loads (verifies) one program of `ebpf`.
fn load_xdp(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .with_context(|| format!("no program {name} in the object"))?
        .try_into()
        .with_context(|| format!("{name} is not an XDP program"))?;
    prog.load().with_context(|| format!("loading {name}"))
}

/// Loads (verifies) one TC program of `ebpf`.
fn load_tc(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(name)
        .with_context(|| format!("no program {name} in the object"))?
        .try_into()
        .with_context(|| format!("{name} is not a TC program"))?;
    prog.load().with_context(|| format!("loading {name}"))
}

fn tc<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a SchedClassifier> {
    ebpf.program(name)
        .with_context(|| format!("no program {name} in the object"))?
        .try_into()
        .with_context(|| format!("{name} is not a TC program"))
}

/// A program to test-run: an XDP one, or a TC one (its verdicts read as XDP ones,
/// `fixture::xdp_verdict_of_tc`).
#[derive(Clone, Copy)]
enum Prog<'a> {
    Xdp(&'a Xdp),
    Tc(&'a SchedClassifier),
}

fn xdp<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a Xdp> {
    ebpf.program(name)
        .with_context(|| format!("no program {name} in the object"))?
        .try_into()
        .with_context(|| format!("{name} is not an XDP program"))
}

/// One BPF_PROG_TEST_RUN call: the last verdict and the kernel's mean ns per run.
fn test_run(prog: Prog<'_>, frame: &[u8], repeat: u32) -> Result<(u32, u64)> {
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.repeat = repeat;
    let context = || format!("BPF_PROG_TEST_RUN, repeat {repeat}");
    let (verdict, duration) = match prog {
        Prog::Xdp(p) => {
            let r = p.test_run(opts).with_context(context)?;
            (r.return_value, r.duration)
        }
        Prog::Tc(p) => {
            let r = p.test_run(opts).with_context(context)?;
            (fixture::xdp_verdict_of_tc(r.return_value), r.duration)
        }
    };
    let ns = u64::try_from(duration.as_nanos()).context("duration out of range")?;
    Ok((verdict, ns))
}

fn verdict_name(verdict: u32) -> &'static str {
    match verdict {
        0 => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        3 => "XDP_TX",
        4 => "XDP_REDIRECT",
        _ => "unknown",
    }
}

fn check_verdict(scenario: &str, got: u32, want: u32) -> Result<()> {
    ensure!(
        got == want,
        "{scenario}: the program returned {got} ({}), expected {want} ({})",
        verdict_name(got),
        verdict_name(want)
    );
    Ok(())
}

/// A fragment of an IPv4 TCP datagram to `dst`:443, 66 bytes (the first fragment's
/// payload a multiple of 8 bytes, as the first fragment of a real datagram): the first
/// one (offset 0, its TCP header whole), or a later one at offset 800 that ends it.
fn fragment(src: Ipv4Addr, dst: Ipv4Addr, first: bool) -> Vec<u8> {
    FrameBuilder::ipv4(src, dst)
        .ip_id(FRAGMENT_ID)
        .ipv4_fragment(if first { 0 } else { 100 }, first)
        .tcp(40_000, DST_PORT, TCP_ACK)
        .payload_len(12)
        .build()
}

/// A 64-byte IPv4 TCP ACK to `dst`:443.
fn frame(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    FrameBuilder::ipv4(src, dst)
        .tcp(40_000, DST_PORT, TCP_ACK)
        .frame_len(FRAME_LEN)
        .build()
}

/// Walks addresses of 198.18.0.0/15 one at a time, wrapping around: the first
/// `NEW_SOURCES` of them for new sources, the last `KNOWN_SOURCES` for a working set of
/// known ones (sent once before they are measured).
struct Sources {
    base: u32,
    size: u32,
    next: u32,
}

/// Known sources cycled through by the established-source rows: a working set whose
/// cells stay in the CPU's caches, and one that does not (2^17 cache lines, 8 MiB of
/// cells over 32 MiB of sketch: more than L2 and the TLB's reach here).
const KNOWN_SOURCES: u32 = 4096;
const KNOWN_SOURCES_LARGE: u32 = 65_536;
const NEW_SOURCES: u32 = TEST_NET_SIZE - KNOWN_SOURCES_LARGE;

impl Sources {
    fn new() -> Self {
        Sources {
            base: 0,
            size: NEW_SOURCES,
            next: 0,
        }
    }

    fn known(size: u32) -> Self {
        Sources {
            base: TEST_NET_SIZE - size,
            size,
            next: 0,
        }
    }

    fn next(&mut self) -> Ipv4Addr {
        let addr = Ipv4Addr::from(TEST_NET + self.base + self.next);
        self.next = (self.next + 1) % self.size;
        addr
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios

#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Repeat,
    PerFrame,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::Repeat => "repeat",
            Method::PerFrame => "per frame",
        }
    }
}

/// One line of the result table.
struct Row {
    scenario: String,
    method: Method,
    ns: f64,
    /// `baseline_pass` measured with the same method.
    baseline_ns: f64,
    verdict: u32,
    /// Whether the ≤ 4× hot-path target applies.
    hot_path: bool,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.ns / self.baseline_ns
    }
}

/// A frame run `REPEAT` times per call.
struct RepeatCase<'a> {
    scenario: &'static str,
    prog: Prog<'a>,
    frame: Vec<u8>,
    want: u32,
    hot_path: bool,
    /// Compared with `baseline_tc_drop` instead of `baseline_pass` (a TC test run builds
    /// a socket buffer per run, which an XDP one does not).
    tc: bool,
}

/// Scenarios 1–4: baselines, no rule matched, hot path passing, hot path dropping; and
/// the TC build dropping beside a trivial TC program.
fn repeat_scenarios(baselines: &Ebpf, limiter: &Loaded) -> Result<Vec<Row>> {
    let src = Ipv4Addr::new(198, 18, 0, 1);
    let prog = Prog::Xdp(limiter.program.xdp()?);
    let linear = Prog::Xdp(limiter.program.xdp_variant(Variant::Linear)?);
    let tc_build = Prog::Tc(limiter.program.tc()?);
    let case = |scenario, prog, dst, want, hot_path| RepeatCase {
        scenario,
        prog,
        frame: frame(src, dst),
        want,
        hot_path,
        tc: matches!(prog, Prog::Tc(_)),
    };
    let (pass, drop, tc_drop) = (
        Prog::Xdp(xdp(baselines, "baseline_pass")?),
        Prog::Xdp(xdp(baselines, "baseline_drop")?),
        Prog::Tc(tc(baselines, "baseline_tc_drop")?),
    );
    let fragment_case = |scenario, first| RepeatCase {
        scenario,
        prog,
        frame: fragment(src, DST_FRAGMENTS, first),
        want: XDP_PASS,
        hot_path: false,
        tc: false,
    };
    let cases = [
        case("baseline_pass", pass, DST_HOT_PASS, XDP_PASS, false),
        case("baseline_drop", drop, DST_HOT_PASS, XDP_DROP, false),
        case("no rule matched", prog, DST_UNMATCHED, XDP_PASS, false),
        case("hot path passing", prog, DST_HOT_PASS, XDP_PASS, true),
        case("hot path dropping", prog, DST_HOT_DROP, XDP_DROP, true),
        case(
            "hot path dropping, precise clock (burst < 33.6 ms)",
            prog,
            DST_PRECISE_DROP,
            XDP_DROP,
            true,
        ),
        case(
            "hot path dropping, linear build",
            linear,
            DST_LINEAR_DROP,
            XDP_DROP,
            true,
        ),
        case(
            "baseline_tc_drop (TC; the ratio base of the row below)",
            tc_drop,
            DST_HOT_PASS,
            XDP_DROP,
            false,
        ),
        case(
            "hot path dropping, TC build (÷ baseline_tc_drop)",
            tc_build,
            DST_TC_DROP,
            XDP_DROP,
            false,
        ),
        // The first fragment's run leaves the record the later fragment's runs read.
        fragment_case(
            "first fragment passing (writes its datagram's record)",
            true,
        ),
        fragment_case("later fragment passing (classified by the record)", false),
    ];
    // Exhaust the 1/s bucket, and warm everything up (JIT image, caches, map entries).
    let repeat = repeat_here();
    for case in &cases {
        test_run(case.prog, &case.frame, repeat / 10)?;
    }
    let before = limiter.snapshot()?;
    let started = Instant::now();
    let mut samples = vec![Vec::with_capacity(REPEAT_ROUNDS); cases.len()];
    for _ in 0..REPEAT_ROUNDS {
        for (case, samples) in cases.iter().zip(&mut samples) {
            let (verdict, ns) = test_run(case.prog, &case.frame, repeat)?;
            check_verdict(case.scenario, verdict, case.want)?;
            samples.push(ns as f64);
        }
    }
    let runs = u64::from(repeat) * REPEAT_ROUNDS as u64;
    let delta = fixture::delta(&before, &limiter.snapshot()?);
    check_repeat_counters(&delta, runs, started.elapsed())?;

    let medians: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    let baseline_ns = medians[0];
    let tc_baseline_ns = cases
        .iter()
        .zip(&medians)
        .find(|(case, _)| case.tc && case.scenario.starts_with("baseline_tc_drop"))
        .map(|(_, &ns)| ns)
        .context("no baseline_tc_drop case")?;
    Ok(cases
        .iter()
        .zip(medians)
        .map(|(case, ns)| Row {
            scenario: case.scenario.to_string(),
            method: Method::Repeat,
            ns,
            baseline_ns: if case.tc { tc_baseline_ns } else { baseline_ns },
            verdict: case.want,
            hot_path: case.hot_path,
        })
        .collect())
}

/// The cost of handing frames over (`next_program`): the stand-in load balancer alone,
/// the limiter's linear build alone, and the same build tail-calling the stand-in for
/// every frame it passes, each with `baseline_pass` measured in the same rounds (the
/// dispatcher's rows: [`dispatcher_scenarios`]).
fn handoff_scenarios(baselines: &Ebpf, alone: &Loaded) -> Result<Vec<Row>> {
    let src = Ipv4Addr::new(198, 18, 0, 1);
    let lb = limiter_tests::handoff::StandinLb::load()?;
    let mut handing = load_limiter(SMALL_SOURCES)?;
    let _arrays = limiter_tests::handoff::hand_over(
        &mut handing.program,
        &mut handing.maps,
        Variant::Linear,
        lb.fd(limiter_tests::handoff::LB)?,
    )?;
    let cases: [(&'static str, Prog<'_>, u32); 4] = [
        (
            "baseline_pass (the ratio base of the rows below)",
            Prog::Xdp(xdp(baselines, "baseline_pass")?),
            XDP_PASS,
        ),
        (
            "stand-in load balancer alone (counts, XDP_TX)",
            Prog::Xdp(lb.program(limiter_tests::handoff::LB)?),
            limiter_tests::handoff::XDP_TX,
        ),
        (
            "hot path passing, linear build, to the stack",
            Prog::Xdp(alone.program.xdp_variant(Variant::Linear)?),
            XDP_PASS,
        ),
        (
            "hot path passing, linear build, tail call to the stand-in LB",
            Prog::Xdp(handing.program.xdp_variant(Variant::Linear)?),
            limiter_tests::handoff::XDP_TX,
        ),
    ];
    measure_repeat(&cases, frame(src, DST_HOT_PASS))
}

/// What a libxdp dispatcher adds (`xdp_share = "libxdp"`): the limiter's component alone
/// in a dispatcher (linked over its main function, as libxdp does for one component),
/// and the limiter then the stand-in LB as two components (the dispatcher calls each
/// stub in turn and goes on while a component returns XDP_PASS), each with
/// `baseline_pass` in the same rounds, next to the tail-call rows above. Needs freplace:
/// an error says why the rows cannot be measured here.
fn dispatcher_scenarios(baselines: &Ebpf) -> Result<Vec<Row>> {
    if let Some(refusal) = limiter_user::attach::libxdp::freplace_refusal() {
        anyhow::bail!("this kernel refuses freplace ({refusal})");
    }
    use limiter_user::attach::libxdp::{target_function, unattached_dispatcher};
    let pins = limiter_tests::scenario::PinDir::new();
    let mut pinned = fixture::load_pinned(&config(SMALL_SOURCES), &pins.path)?;
    let lone = unattached_dispatcher(1)?;
    let pair = unattached_dispatcher(2)?;
    let fd_of = |ebpf: &Ebpf| -> Result<aya::programs::ProgramFd> {
        Ok(xdp(ebpf, limiter_common::dispatcher::PROGRAM_NAME)?
            .fd()?
            .try_clone()?)
    };
    let (lone_fd, pair_fd) = (fd_of(&lone)?, fd_of(&pair)?);
    let component = pinned.program.component(&pins.path)?;
    component
        .load(lone_fd, target_function(1, 0))
        .context("loading the limiter's component")?;
    // The links live as long as the programs that made them (to the end of this function).
    component
        .attach()
        .context("linking the limiter's component")?;
    component
        .attach_to_program(&pair_fd, target_function(2, 0))
        .context("linking the limiter's component to the second dispatcher")?;
    let mut lb_object = aya::EbpfLoader::new()
        .extension(limiter_tests::handoff::LB)
        .load(limiter_user::host::object::STANDIN_LB_OBJECT)
        .context("loading the stand-in LB as a component")?;
    let lb: &mut aya::programs::Extension = lb_object
        .program_mut(limiter_tests::handoff::LB)
        .context("no stand-in LB")?
        .try_into()?;
    lb.load(pair_fd, target_function(2, 1))
        .context("loading the stand-in LB's component")?;
    lb.attach().context("linking the stand-in LB's component")?;
    let cases: [(&'static str, Prog<'_>, u32); 3] = [
        (
            "baseline_pass (the ratio base of the rows below)",
            Prog::Xdp(xdp(baselines, "baseline_pass")?),
            XDP_PASS,
        ),
        (
            "hot path passing, the limiter alone in a libxdp dispatcher",
            Prog::Xdp(xdp(&lone, limiter_common::dispatcher::PROGRAM_NAME)?),
            XDP_PASS,
        ),
        (
            "hot path passing, dispatcher: the limiter then the stand-in LB",
            Prog::Xdp(xdp(&pair, limiter_common::dispatcher::PROGRAM_NAME)?),
            limiter_tests::handoff::XDP_TX,
        ),
    ];
    measure_repeat(&cases, frame(Ipv4Addr::new(198, 18, 0, 1), DST_HOT_PASS))
}

/// Events per second and CPU the sampling row allows (`[monitor] events_per_sec`).
const SAMPLING_BUDGET: u32 = 1_000;

/// What sampling refusals costs under a flood (`[monitor] events_per_sec`): one dropping
/// frame on two programs of the same size, one with sampling off, one sampling at
/// [`SAMPLING_BUDGET`] events/s per CPU (after each second's first events every refusal
/// meets a spent budget: a flood's path), with `baseline_pass` in the same rounds. A
/// thread drains the ring buffer as `limiter monitor` would. Fails if more events were
/// written than the budget allows over the time, or any was lost.
fn sampling_scenarios(baselines: &Ebpf) -> Result<Vec<Row>> {
    let off = load_limiter(SMALL_SOURCES)?;
    let mut on = load_limiter(SMALL_SOURCES)?;
    on.maps
        .set_monitor_config(limiter_common::drop::MonitorConfig {
            events_per_sec: SAMPLING_BUDGET,
            snap_len: 128,
        })
        .context("turning sampling on")?;
    let ring = on
        .maps
        .take_drop_events()
        .context("the program has no DROP_EVENTS ring buffer")?;
    let mut reader = bench::host::RingReader::start(ring);
    let before = on.maps.monitor_counters()?;
    let started = Instant::now();
    let cases: [(&'static str, Prog<'_>, u32); 3] = [
        (
            "baseline_pass (the ratio base of the rows below)",
            Prog::Xdp(xdp(baselines, "baseline_pass")?),
            XDP_PASS,
        ),
        (
            "hot path dropping, sampling off",
            Prog::Xdp(off.program.xdp()?),
            XDP_DROP,
        ),
        (
            "hot path dropping, sampling on (1,000 events/s per CPU, read as they come)",
            Prog::Xdp(on.program.xdp()?),
            XDP_DROP,
        ),
    ];
    let rows = measure_repeat(&cases, frame(Ipv4Addr::new(198, 18, 0, 1), DST_HOT_DROP));
    let elapsed = started.elapsed();
    let read = reader.finish()?;
    let rows = rows?;
    let after = on.maps.monitor_counters()?;
    let sampled = after.sampled - before.sampled;
    // One CPU runs the test runs (pinned); a budget is per second of the clock, so a
    // run of T seconds spans at most ceil(T) + 1 of them.
    let allowed = u64::from(SAMPLING_BUDGET) * (elapsed.as_secs() + 2);
    ensure!(
        sampled <= allowed,
        "sampling wrote {sampled} events in {elapsed:?}, over its budget's {allowed}"
    );
    ensure!(
        sampled > 0 && after.skipped_budget > before.skipped_budget,
        "sampling wrote {sampled} events and skipped none: the row did not take the flood's path"
    );
    ensure!(
        after.lost_full == before.lost_full,
        "{} events lost to a full ring buffer with a reader draining it",
        after.lost_full - before.lost_full
    );
    println!(
        "sampling: {sampled} events written ({read} read) in {:.1} s, {} refusals over the \
         budget; at most {allowed} allowed",
        elapsed.as_secs_f64(),
        after.skipped_budget - before.skipped_budget
    );
    Ok(rows)
}

/// Rounds of `cases` (the first is the ratio base), interleaved, median per case.
fn measure_repeat(cases: &[(&'static str, Prog<'_>, u32)], frame: Vec<u8>) -> Result<Vec<Row>> {
    let repeat = repeat_here();
    for (_, prog, _) in cases {
        test_run(*prog, &frame, repeat / 10)?;
    }
    let mut samples = vec![Vec::with_capacity(REPEAT_ROUNDS); cases.len()];
    for _ in 0..REPEAT_ROUNDS {
        for ((scenario, prog, want), samples) in cases.iter().zip(&mut samples) {
            let (verdict, ns) = test_run(*prog, &frame, repeat)?;
            check_verdict(scenario, verdict, *want)?;
            samples.push(ns as f64);
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    Ok(cases
        .iter()
        .zip(&medians)
        .map(|((scenario, _, want), &ns)| Row {
            scenario: scenario.to_string(),
            method: Method::Repeat,
            ns,
            baseline_ns: medians[0],
            verdict: *want,
            hot_path: false,
        })
        .collect())
}

/// Runs per call: [`REPEAT`], a tenth of it in an emulated guest (every run there costs
/// tens of times more).
fn repeat_here() -> u32 {
    if limiter_tests::in_guest() {
        REPEAT / 10
    } else {
        REPEAT
    }
}

/// Every run of scenarios 2–4 went the way its name says, not just the last of a call.
/// The 1/s bucket of the dropping rule admits one frame per second that `elapsed`.
fn check_repeat_counters(delta: &Snapshot, runs: u64, elapsed: Duration) -> Result<()> {
    let rule = |name: &str| {
        delta
            .rules
            .get(name)
            .copied()
            .with_context(|| format!("no counters for rule {name}"))
    };
    let (pass, drop) = (rule("hot-pass")?, rule("hot-drop")?);
    let (precise, linear) = (rule("precise-drop")?, rule("linear-drop")?);
    let tc_drop = rule("tc-drop")?;
    let fragments = rule("frag-pass")?;
    ensure!(
        delta.global.unmatched == runs,
        "no rule matched: {} of {runs} runs counted as unmatched",
        delta.global.unmatched
    );
    ensure!(
        pass.passed_packets == runs && pass.dropped_packets == 0,
        "hot path passing: {} passed, {} dropped of {runs} runs",
        pass.passed_packets,
        pass.dropped_packets
    );
    let refills = elapsed.as_secs() + 1;
    ensure!(
        drop.dropped_packets + drop.passed_packets == runs && drop.passed_packets <= refills,
        "hot path dropping: {} dropped, {} passed of {runs} runs in {elapsed:?} \
         (at most {refills} may pass)",
        drop.dropped_packets,
        drop.passed_packets
    );
    ensure!(
        linear.dropped_packets + linear.passed_packets == runs && linear.passed_packets <= refills,
        "hot path dropping, linear build: {} dropped, {} passed of {runs} runs in {elapsed:?} \
         (at most {refills} may pass)",
        linear.dropped_packets,
        linear.passed_packets
    );
    ensure!(
        tc_drop.dropped_packets + tc_drop.passed_packets == runs
            && tc_drop.passed_packets <= refills,
        "hot path dropping, TC build: {} dropped, {} passed of {runs} runs in {elapsed:?} \
         (at most {refills} may pass)",
        tc_drop.dropped_packets,
        tc_drop.passed_packets
    );
    ensure!(
        fragments.passed_packets == 2 * runs && fragments.dropped_packets == 0,
        "fragments passing: {} passed, {} dropped of {} runs",
        fragments.passed_packets,
        fragments.dropped_packets,
        2 * runs
    );
    let precise_refills = PRECISE_RATE * refills;
    ensure!(
        precise.dropped_packets + precise.passed_packets == runs
            && precise.passed_packets <= precise_refills
            && precise.dropped_packets >= runs / 2,
        "hot path dropping, precise clock: {} dropped, {} passed of {runs} runs in \
         {elapsed:?} (at most {precise_refills} may pass)",
        precise.dropped_packets,
        precise.passed_packets
    );
    ensure!(
        delta.global.contended == 0,
        "{} runs lost a CAS race",
        delta.global.contended
    );
    Ok(())
}

/// Frames to one program, each from the next source and each in a call of its own.
struct Stream<'a> {
    scenario: &'static str,
    prog: Prog<'a>,
    frame: Vec<u8>,
    sources: Sources,
    /// The verdict every frame must get; `None`: either (a sketch's new source may find
    /// its cells busy with others' frames, a known source may have refilled).
    want: Option<u32>,
}

impl<'a> Stream<'a> {
    fn new(scenario: &'static str, prog: &'a Xdp) -> Self {
        Stream {
            scenario,
            prog: Prog::Xdp(prog),
            frame: frame(Ipv4Addr::new(198, 18, 0, 1), DST_PER_SOURCE),
            sources: Sources::new(),
            want: Some(XDP_PASS),
        }
    }

    /// Frames from a known working set of `size` sources, any verdict.
    fn known(scenario: &'static str, prog: &'a Xdp, size: u32) -> Self {
        Stream {
            sources: Sources::known(size),
            want: None,
            ..Stream::new(scenario, prog)
        }
    }

    fn any_verdict(self) -> Self {
        Stream { want: None, ..self }
    }

    /// One frame from `src` (repeat = 1): the verdict and the kernel-measured ns.
    fn send(&mut self, src: Ipv4Addr) -> Result<(u32, u64)> {
        with_ipv4_src(&mut self.frame, src).context("rewriting the source address")?;
        test_run(self.prog, &self.frame, 1)
    }

    /// `frames` frames from new sources, each expected to pass; the mean ns per call.
    fn run(&mut self, frames: usize) -> Result<f64> {
        let mut total = 0_u64;
        for _ in 0..frames {
            let src = self.sources.next();
            let (verdict, ns) = self.send(src)?;
            match self.want {
                Some(want) => check_verdict(self.scenario, verdict, want)?,
                None if verdict != XDP_PASS && verdict != XDP_DROP => {
                    check_verdict(self.scenario, verdict, XDP_PASS)?
                }
                None => {}
            }
            total += ns;
        }
        Ok(total as f64 / frames as f64)
    }
}

/// Scenarios 5 and 6, each frame from a new source, the same program's known sources,
/// and `baseline_pass` the same way; then the candidate structures (baseline object's
/// `cand_*`), each with a new source per frame and its known sources.
fn per_frame_scenarios(baselines: &Ebpf, large: &Loaded, small: &Loaded) -> Result<Vec<Row>> {
    let mut streams = vec![
        Stream::new("baseline_pass", xdp(baselines, "baseline_pass")?),
        Stream::new(
            "new source every frame (max_sources 1048576)",
            large.program.xdp()?,
        )
        .any_verdict(),
        Stream::known(
            "known source every frame (max_sources 1048576; 4096 known sources)",
            large.program.xdp()?,
            KNOWN_SOURCES,
        ),
        Stream::known(
            "known source every frame (max_sources 1048576; 65536 known sources)",
            large.program.xdp()?,
            KNOWN_SOURCES_LARGE,
        ),
        Stream::new(
            "new source every frame, small sketch (max_sources 4096)",
            small.program.xdp()?,
        )
        .any_verdict(),
    ];
    for (name, label) in CANDIDATES {
        let prog = xdp(baselines, name)?;
        let new = Stream::new(label.new, prog);
        streams.push(if name.starts_with("cand_sketch") {
            new.any_verdict()
        } else {
            new
        });
        streams.push(Stream::known(label.known, prog, KNOWN_SOURCES));
    }
    // Warm up; the known streams send each of their sources once.
    for stream in &mut streams {
        let frames = if stream.sources.base == 0 {
            FRAMES_PER_ROUND
        } else {
            stream.sources.size as usize
        };
        stream.run(frames)?;
    }

    let before = (large.snapshot()?, small.snapshot()?);
    let mut samples: Vec<Vec<f64>> = streams.iter().map(|_| Vec::new()).collect();
    for _ in 0..FRAME_ROUNDS {
        for (stream, samples) in streams.iter_mut().zip(&mut samples) {
            samples.push(stream.run(FRAMES_PER_ROUND)?);
        }
    }
    let frames = (FRAMES_PER_ROUND * FRAME_ROUNDS) as u64;
    let after_large = large.snapshot()?;
    // The large program saw the new and both known streams.
    check_source_counters(
        streams[1].scenario,
        &fixture::delta(&before.0, &after_large),
        3 * frames,
    )?;
    check_source_counters(
        streams[4].scenario,
        &fixture::delta(&before.1, &small.snapshot()?),
        frames,
    )?;
    check_no_eviction(&mut streams[4])?;

    let medians: Vec<f64> = samples.into_iter().map(|mut s| median(&mut s)).collect();
    Ok(streams
        .iter()
        .zip(&medians)
        .map(|(stream, &ns)| Row {
            scenario: stream.scenario.to_string(),
            method: Method::PerFrame,
            ns,
            baseline_ns: medians[0],
            verdict: stream.want.unwrap_or(XDP_PASS),
            hot_path: false,
        })
        .collect())
}

/// Row labels of one per-source structure (docs/per-source-limits.md's cost table: the
/// LRU rows measure the structure the limiter used before the sketch, for comparison).
struct CandidateLabel {
    new: &'static str,
    known: &'static str,
}

/// The per-source structures measured beside the limiter (limiter-ebpf's
/// `bin/baseline/candidates.rs`), each sized for 2^20 sources.
const CANDIDATES: [(&str, CandidateLabel); 6] = [
    (
        "cand_lru",
        CandidateLabel {
            new: "structure: LRU hash, one LRU for all CPUs (the limiter's before the sketch): new source",
            known: "structure: LRU hash, one LRU for all CPUs (the limiter's before the sketch): known source",
        },
    ),
    (
        "cand_lru_nocommon",
        CandidateLabel {
            new: "structure: LRU hash, BPF_F_NO_COMMON_LRU (per-CPU lists): new source",
            known: "structure: LRU hash, BPF_F_NO_COMMON_LRU (per-CPU lists): known source",
        },
    ),
    (
        "cand_lru_percpu",
        CandidateLabel {
            new: "structure: LRU_PERCPU hash (limits per CPU, cost only): new source",
            known: "structure: LRU_PERCPU hash (limits per CPU, cost only): known source",
        },
    ),
    (
        "cand_hash",
        CandidateLabel {
            new: "structure: preallocated hash: new source",
            known: "structure: preallocated hash: known source",
        },
    ),
    (
        "cand_sketch",
        CandidateLabel {
            new: "structure: sketch, 2 rows of GCRA cells (the limiter's): new source",
            known: "structure: sketch, 2 rows of GCRA cells (the limiter's): known source",
        },
    ),
    (
        "cand_sketch_line",
        CandidateLabel {
            new: "structure: sketch, 2 cells in one cache line: new source",
            known: "structure: sketch, 2 cells in one cache line: known source",
        },
    ),
];

/// Entries of each candidate's map.
const CANDIDATE_SOURCES: u32 = 1 << 20;

/// The baseline object with its candidate maps sized for [`CANDIDATE_SOURCES`] and the
/// candidate sketch's seed and width written.
fn load_baselines() -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    for map in ["CAND_LRU", "CAND_LRU_NOCOM", "CAND_LRU_PCPU", "CAND_HASH"] {
        loader.map_max_entries(map, CANDIDATE_SOURCES);
    }
    loader.map_max_entries("CAND_SKETCH", sketch::cells_for(CANDIDATE_SOURCES));
    loader.map_max_entries("CAND_SKETCH_LINE", sketch::cells_for(CANDIDATE_SOURCES));
    let mut ebpf = loader
        .load(BASELINE_OBJECT)
        .context("loading the baseline object")?;
    let mut meta: Array<_, SketchMeta> = Array::try_from(
        ebpf.map_mut("CAND_SKETCH_META")
            .context("no map CAND_SKETCH_META in the baseline object")?,
    )?;
    meta.set(
        0,
        SketchMeta {
            seed: [0x5eed_0001, 0x5eed_0002],
            width_mask: sketch::width_for(CANDIDATE_SOURCES) - 1,
            rows: sketch::ROWS,
        },
        0,
    )
    .context("writing CAND_SKETCH_META")?;
    for name in CANDIDATES.map(|(n, _)| n) {
        load_xdp(&mut ebpf, name)?;
    }
    Ok(ebpf)
}

/// Every frame was metered by the per-source limit: none passed unmetered for want of
/// a sketch (an unmetered frame would make the scenario measure something else).
fn check_source_counters(scenario: &str, delta: &Snapshot, frames: u64) -> Result<()> {
    let rule = delta
        .rules
        .get("per-source")
        .with_context(|| format!("{scenario}: no counters for rule per-source"))?;
    ensure!(
        delta.global.sketch_unseeded == 0,
        "{scenario}: {} frames found no sketch set up",
        delta.global.sketch_unseeded
    );
    ensure!(
        rule.passed_packets + rule.dropped_packets == frames,
        "{scenario}: {} passed + {} dropped of {frames} frames",
        rule.passed_packets,
        rule.dropped_packets
    );
    Ok(())
}

/// Proves churn buys a throttled source nothing (the per-source LRU of versions before
/// the sketch evicted it here): a marker source, then twice the sketch's width of newer sources; the marker's
/// next frame within its second still drops.
fn check_no_eviction(churn: &mut Stream<'_>) -> Result<()> {
    let started = Instant::now();
    let marker = churn.sources.next();
    let (first, _) = churn.send(marker)?;
    let (second, _) = churn.send(marker)?;
    check_verdict("churn probe: marker source, second frame", second, XDP_DROP)?;
    churn.run(2 * SMALL_SOURCES as usize)?;
    let (again, _) = churn.send(marker)?;
    check_verdict(
        "churn probe: marker source after churn (throttled, must stay so)",
        again,
        XDP_DROP,
    )?;
    ensure!(
        started.elapsed() < Duration::from_millis(500),
        "churn probe took {:?}; too slow to tell a kept state from a refill",
        started.elapsed()
    );
    let _ = first;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Verifier

/// The verifier's processed-instruction count with the largest per-source map.
struct VerifierCount {
    max_sources: u32,
    instructions: Option<u32>,
    /// Sizes that failed to load first, with why.
    failures: Vec<(u32, String)>,
}

/// Loads the limiter with `max_sources` = 2^24, halving until it loads.
fn verifier_count() -> Result<VerifierCount> {
    let mut failures = Vec::new();
    let mut max_sources = MAX_MAX_SOURCES;
    loop {
        let opts = LoadOptions {
            pin_dir: None,
            max_sources,
            handoff_array: None,
        };
        match Program::load(&opts) {
            Ok(program) => {
                return Ok(VerifierCount {
                    max_sources,
                    instructions: program.verified_instructions(),
                    failures,
                })
            }
            Err(e) if max_sources > SMALL_SOURCES => {
                failures.push((max_sources, format!("{:#}", anyhow::Error::new(e))));
                max_sources /= 2;
            }
            Err(e) => return Err(e).context(format!("loading limiter, max_sources {max_sources}")),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Report

/// Where and on what the figures were measured.
struct Header {
    kernel: String,
    cpu_model: String,
    /// The CPU the BPF_PROG_TEST_RUN part is pinned to.
    cpu: Option<usize>,
}

impl Header {
    fn read(cpu: Option<usize>) -> Result<Header> {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .context("reading /proc/sys/kernel/osrelease")?;
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, m)| m)
            })
            .unwrap_or("unknown");
        Ok(Header {
            kernel: kernel.trim().to_string(),
            cpu_model: cpu_model.trim().to_string(),
            cpu,
        })
    }
}

/// This thread's CPU affinity.
fn current_affinity() -> Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; size and pointer describe `set`.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("sched_getaffinity");
    }
    Ok(set)
}

fn set_affinity(set: &libc::cpu_set_t) -> Result<()> {
    // SAFETY: pid 0 is this thread; size and pointer describe `set`.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("sched_setaffinity");
    }
    Ok(())
}

/// Pins this thread to the CPU it runs on: per-CPU state (the LRU structures' free lists,
/// counters) and caches stay put for the whole run.
fn pin_to_current_cpu() -> Result<usize> {
    // SAFETY: no arguments, no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    let cpu = usize::try_from(cpu)
        .map_err(|_| io::Error::last_os_error())
        .context("sched_getcpu")?;
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and `cpu` is a CPU the kernel just reported.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is this thread; size and pointer describe `set`.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("sched_setaffinity");
    }
    Ok(cpu)
}

struct Report {
    text: String,
    markdown: String,
}

const COLUMNS: [&str; 5] = [
    "scenario",
    "method",
    "ns/frame",
    "× baseline_pass",
    "verdict",
];

fn render(header: &Header, verifier: &VerifierCount, rows: &[Row]) -> Report {
    let cells: Vec<[String; 5]> = rows.iter().map(cells).collect();
    let intro = intro_lines(header, verifier);
    let outro = outro_lines(rows);
    let mut text = String::new();
    let mut markdown = String::from("# limiter: BPF_PROG_TEST_RUN cost per frame\n\n");
    for line in &intro {
        let _ = writeln!(text, "{line}");
        let _ = writeln!(markdown, "- {line}");
    }
    text.push('\n');
    markdown.push('\n');
    text.push_str(&text_table(&cells));
    markdown.push_str(&markdown_table(&cells));
    text.push('\n');
    markdown.push('\n');
    for line in &outro {
        let _ = writeln!(text, "{line}");
        let _ = writeln!(markdown, "- {line}");
    }
    Report { text, markdown }
}

fn cells(row: &Row) -> [String; 5] {
    [
        row.scenario.clone(),
        row.method.label().to_string(),
        format!("{:.1}", row.ns),
        format!("{:.2}", row.ratio()),
        format!("{} ({})", verdict_name(row.verdict), row.verdict),
    ]
}

fn intro_lines(header: &Header, verifier: &VerifierCount) -> Vec<String> {
    let mut lines = vec![
        format!(
            "kernel {}, CPU {} (pinned to CPU {})",
            header.kernel,
            header.cpu_model,
            header
                .cpu
                .map_or_else(|| "none".to_string(), |c| c.to_string())
        ),
        format!("{FRAME_LEN}-byte IPv4 TCP frames, addresses in 198.18.0.0/15"),
        format!(
            "rules (unit packets, enforce): hot path passing = rate 1e9/s burst 1e9; \
             hot path dropping = rate 1/s burst 1, exhausted (both on the tick clock); \
             precise clock = rate {PRECISE_RATE}/s burst 1 (1 ms, below the tick clock's \
             minimum); new source = per_source rate 1/s burst 1 per /32, no aggregate; \
             fragments = one IPv4 datagram's first and a later fragment (66 bytes) to a \
             rule of rate 1e9/s burst 1e9"
        ),
        "builds: `limiter` (multi-buffer aware, reads the frame length with a helper) unless \
         the row says `linear build` (`limiter_linear`, what native mode attaches where the \
         MTU allows) or `TC build` (`limiter_tc`, `xdp_mode = \"tc\"`); a TC test run \
         builds a socket buffer per run, so the TC build's ratio is to a trivial TC program \
         measured the same way, and its verdicts are shown as their XDP equivalents \
         (TC_ACT_SHOT as XDP_DROP)"
            .to_string(),
        format!(
            "repeat: {} runs per call, median of {REPEAT_ROUNDS} interleaved rounds \
             (the kernel reports whole ns per run){}",
            repeat_here(),
            if limiter_tests::in_guest() {
                "; in an emulated guest: compare ratios of this run, never nanoseconds"
            } else {
                ""
            }
        ),
        format!(
            "per frame: repeat = 1, a new source each call, mean of {FRAMES_PER_ROUND} calls, \
             median of {FRAME_ROUNDS} interleaved rounds; includes the harness's clock read, \
             so its baseline_pass is measured the same way"
        ),
    ];
    for (size, why) in &verifier.failures {
        lines.push(format!(
            "limiter with max_sources = {size} did not load: {why}"
        ));
    }
    let count = verifier.instructions.map_or_else(
        || "not reported by the kernel".to_string(),
        |n| n.to_string(),
    );
    lines.push(format!(
        "verifier: {count} instructions processed (the largest of the linear, multi-buffer and TC builds, max_sources = {})",
        verifier.max_sources
    ));
    lines
}

fn outro_lines(rows: &[Row]) -> Vec<String> {
    let mut lines: Vec<String> = rows
        .iter()
        .filter(|r| r.hot_path)
        .map(|r| {
            let met = if r.ratio() <= HOT_PATH_TARGET {
                "met"
            } else {
                "NOT met"
            };
            format!(
                "hot-path target ≤ {HOT_PATH_TARGET:.0}× baseline_pass: {} at {:.2}×: {met}",
                r.scenario,
                r.ratio()
            )
        })
        .collect();
    // The new-source target (README: A spoofed-source flood), against both known working sets of the same run.
    let ns = |prefix: &str| {
        rows.iter()
            .find(|r| r.scenario.starts_with(prefix))
            .map(|r| r.ns)
    };
    if let Some(new) = ns("new source every frame (max_sources 1048576)") {
        for (what, prefix) in [
            (
                "cached",
                "known source every frame (max_sources 1048576; 4096",
            ),
            (
                "uncached",
                "known source every frame (max_sources 1048576; 65536",
            ),
        ] {
            if let Some(known) = ns(prefix) {
                let ratio = new / known;
                let met = if ratio <= NEW_SOURCE_TARGET {
                    "met"
                } else {
                    "NOT met"
                };
                lines.push(format!(
                    "new-source target ≤ {NEW_SOURCE_TARGET}× a known source ({what} cells): \
                     {ratio:.2}×: {met}"
                ));
            }
        }
    }
    lines
}

/// The target for a new source every frame (README: A spoofed-source flood), as a multiple of a known source.
const NEW_SOURCE_TARGET: f64 = 1.5;

fn text_table(rows: &[[String; 5]]) -> String {
    let mut widths = COLUMNS.map(|c| c.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if (2..4).contains(&i) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&COLUMNS.map(String::from));
    out += &line(&widths.map(|w| "-".repeat(w)));
    for row in rows {
        out += &line(row);
    }
    out
}

fn markdown_table(rows: &[[String; 5]]) -> String {
    let mut out = format!("| {} |\n", COLUMNS.join(" | "));
    out += "|---|---|---:|---:|---|\n";
    for row in rows {
        out += &format!("| {} |\n", row.join(" | "));
    }
    out
}

/// `target/bench` under the workspace root, created if missing.
fn bench_dir() -> Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the limiter-bench crate has no parent directory")?;
    // A guest sees the workspace read-only but for its output directory.
    let dir = match std::env::var_os("LIMITER_BENCH_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace.join("target").join("bench"),
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
