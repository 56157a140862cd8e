//! What this kernel makes of the program: each build loaded on its own (verifier
//! instructions processed, load time), then attached in each mode to a veth end. Every
//! build must load and every mode must attach; the table it writes is docs/testing.md's
//! kernel × build × mode table (`cargo xtask test --kernel all` fills it for each kernel).
//! Every build, the libxdp component included, must also stay within the verifier budget
//! (`limiter_user::host::verifier::BUDGET_INSNS`) on every kernel this runs on.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{programs::Program as AyaProgram, EbpfLoader};
use limiter_common::abi::{map_name, DEFAULT_MAX_SOURCES};
use limiter_tests::netns::VethPair;
use limiter_user::{
    attach::program::{LoadOptions, Program},
    config::{XdpMode, XdpShare, XdpShareFallback},
    host::{
        object::{Variant, OBJECT},
        verifier::BUDGET_INSNS,
    },
};

fn uname(flag: &str) -> String {
    let out = std::process::Command::new("uname")
        .arg(flag)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Where the table goes: the guest's writable directory, or target/guest/host.
fn out_dir() -> PathBuf {
    std::env::var_os("LIMITER_GUEST_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/guest/host"))
}

/// One build loaded on its own: the object holding it (the program stays loaded for
/// the tests that read it by id), its info or why it did not load, and the load's time
/// (the verifier is nearly all of it).
struct Loaded {
    variant: Variant,
    _ebpf: aya::Ebpf,
    result: Result<(aya::programs::ProgramInfo, Duration), String>,
}

/// Loads one build alone, with the default per-source sketch size. The libxdp component
/// loads as the plain XDP program it is before the daemon makes it an freplace one.
fn load_alone(variant: Variant) -> Loaded {
    let started = Instant::now();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(
            map_name::SRC_SKETCH,
            limiter_common::sketch::cells_for(DEFAULT_MAX_SOURCES),
        )
        .load(OBJECT)
        .expect("loading the object's maps");
    let prog = ebpf.program_mut(variant.program_name()).expect("the build");
    let info = match prog {
        AyaProgram::Xdp(p) => p
            .load()
            .map_err(|e| format!("{e:#}"))
            .and_then(|()| p.info().map_err(|e| format!("{e:#}"))),
        AyaProgram::SchedClassifier(p) => p
            .load()
            .map_err(|e| format!("{e:#}"))
            .and_then(|()| p.info().map_err(|e| format!("{e:#}"))),
        _ => Err("not an XDP or TC program".to_string()),
    };
    let took = started.elapsed();
    Loaded {
        variant,
        _ebpf: ebpf,
        result: info.map(|i| (i, took)),
    }
}

/// Every build (the libxdp component included), each loaded once for
/// the three tests of this file: under a guest's emulation each load is seconds of
/// verifier time.
fn every_build() -> std::sync::MutexGuard<'static, Vec<Loaded>> {
    static LOADED: std::sync::OnceLock<std::sync::Mutex<Vec<Loaded>>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let builds = [
                Variant::Linear,
                Variant::MultiBuffer,
                Variant::Tc,
                Variant::Libxdp,
            ];
            std::sync::Mutex::new(builds.iter().map(|&v| load_alone(v)).collect())
        })
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn every_build_loads_and_every_mode_attaches() {
    let release = uname("-r");
    let loaded = every_build();
    let pair = VethPair::new(1).expect("creating the veth pair");
    let mut attached = Vec::new();
    for mode in [XdpMode::Native, XdpMode::Generic, XdpMode::Tc] {
        // The builds the daemon verifies for the mode: the rest are not needed to attach.
        let builds = limiter_user::attach::program::builds_for(
            XdpShare::Exclusive,
            XdpShareFallback::None,
            false,
            mode,
        );
        let mut program = Program::load_builds(
            &LoadOptions {
                pin_dir: None,
                max_sources: 1024,
                handoff_array: None,
            },
            builds,
        )
        .expect("loading the program");
        let result = program
            .attach(&pair.host, mode)
            .map(|a| {
                let how = format!("{} build, {}", a.variant.as_str(), a.hook());
                program.detach(a).expect("detaching");
                how
            })
            .map_err(|e| e.to_string());
        attached.push((mode, result));
    }

    let mut table = format!(
        "Kernel `{release}` (`{}`)\n\n| build | loads | verifier insns | load time |\n|---|---|---|---|\n",
        uname("-v")
    );
    for l in loaded.iter() {
        match &l.result {
            Ok((info, took)) => table.push_str(&format!(
                "| {} | yes | {} | {:.2} s |\n",
                l.variant.as_str(),
                info.verified_instruction_count()
                    .map_or("?".to_string(), |n| n.to_string()),
                took.as_secs_f64()
            )),
            Err(e) => table.push_str(&format!("| {} | **no**: {e} | | |\n", l.variant.as_str())),
        }
    }
    table.push_str("\n| xdp_mode | attaches as |\n|---|---|\n");
    for (mode, r) in &attached {
        let mode = format!("{mode:?}").to_lowercase();
        match r {
            Ok(how) => table.push_str(&format!("| {mode} | {how} |\n")),
            Err(e) => table.push_str(&format!("| {mode} | **refused**: {e} |\n")),
        }
    }
    println!("{table}");
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kernel-report.md"), &table).unwrap();

    let refused: Vec<String> = loaded
        .iter()
        .filter_map(|l| {
            l.result
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", l.variant.as_str()))
        })
        .chain(
            attached
                .iter()
                .filter_map(|(m, r)| r.as_ref().err().map(|e| format!("{m:?}: {e}"))),
        )
        .collect();
    assert!(refused.is_empty(), "on {release}: {refused:#?}");
}

/// The ratchet: no build may cost the verifier more than the budget, a quarter of its
/// limit. What multiplies the verifier's paths (a branch in the parser, a constant that
/// differs between kinds of frames) shows up here, not as a kernel refusing the program.
#[test]
fn every_build_stays_within_the_verifier_budget() {
    let release = uname("-r");
    let loaded = every_build();
    let mut table = format!(
        "Kernel `{release}`: verifier budget {BUDGET_INSNS} instructions processed\n\n\
         | build | verifier insns | within budget |\n|---|---:|---|\n"
    );
    let mut failures = Vec::new();
    for l in loaded.iter() {
        let build = l.variant.as_str();
        match l
            .result
            .as_ref()
            .map(|(info, _)| info.verified_instruction_count())
        {
            Ok(Some(insns)) => {
                let insns = &insns;
                let within = u64::from(*insns) <= BUDGET_INSNS;
                table.push_str(&format!(
                    "| {build} | {insns} | {} |\n",
                    if within { "yes" } else { "**no**" }
                ));
                if !within {
                    failures.push(format!("{build}: {insns} > {BUDGET_INSNS}"));
                }
            }
            Ok(None) => {
                table.push_str(&format!("| {build} | ? | ? |\n"));
                failures.push(format!(
                    "{build}: the kernel does not report verified_insns (Linux 5.16 and later do)"
                ));
            }
            Err(e) => {
                table.push_str(&format!("| {build} | refused | **no** |\n"));
                failures.push(format!("{build}: refused: {e}"));
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "on {release}:\n{table}\n{failures:#?}");
}

/// Every map lookup the kernel does not inline is bound to its map: a call site that two
/// maps reach (LLVM merges `if a { A.get(k) } else { B.get(k) }` into one call with the
/// map chosen before it) leaves the verifier no map to bind it to, so it stays the
/// generic helper, an indirect call that every frame on that path pays (the LPM tries'
/// lookup, on the path of every frame no rule's host matches: ≈ 10 ns a frame here).
#[test]
fn every_map_lookup_is_bound_to_its_map() {
    let mut generic = Vec::new();
    for l in every_build().iter() {
        let variant = l.variant;
        let id = match &l.result {
            Ok((info, _)) => info.id(),
            Err(e) => panic!("{}: {e}", variant.as_str()),
        };
        let xlated =
            limiter_tests::tools::bpftool(&["prog", "dump", "xlated", "id", &id.to_string()])
                .expect("bpftool prog dump xlated");
        let insns = xlated.as_array().expect("bpftool's instruction list");
        assert!(!insns.is_empty(), "{}: no instructions", variant.as_str());
        for insn in insns {
            let disasm = insn["disasm"].as_str().unwrap_or_default();
            if disasm.contains("call bpf_map_lookup_elem") {
                generic.push(format!("{}: {disasm}", variant.as_str()));
            }
        }
    }
    assert!(
        generic.is_empty(),
        "map lookups left to the generic helper (a call site two maps reach):\n{generic:#?}"
    );
}
