//! `limiter-sim [--out DIR] [--only NAME,…] [--quick] [--seed N]`: runs the fleet scenarios, prints a
//! summary and the checks of the design's claims, writes DIR/report.md (default target/sim)
//! with SVG plots.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::Instant,
};

use anyhow::{bail, Context as _, Result};
use limiter_sim::{claims, fleet, metrics::Run, report, scenario};

struct Args {
    out: PathBuf,
    only: Option<Vec<String>>,
    quick: bool,
    seed: Option<u64>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        out: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target/sim"), |p| p.join("target/sim")),
        only: None,
        quick: false,
        seed: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => args.out = it.next().context("--out needs a directory")?.into(),
            "--only" => {
                let names = it.next().context("--only needs scenario names")?;
                args.only = Some(names.split(',').map(str::to_string).collect());
            }
            "--quick" => args.quick = true,
            "--seed" => {
                let n = it.next().context("--seed needs a number")?;
                args.seed = Some(n.parse().with_context(|| format!("--seed {n:?}"))?);
            }
            "-h" | "--help" => {
                println!(
                    "limiter-sim [--out DIR] [--only NAME,...] [--quick] [--seed N]\n\
                     Runs the fleet scenarios in virtual time and writes DIR/report.md \
                     (default target/sim).\n--quick: 20 s sticky period, Contoso and \
                     Directory only.\n--seed N: another seed for arrivals, weights and \
                     the background tenants (default 11)."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut knobs = if args.quick {
        scenario::Knobs::quick()
    } else {
        scenario::Knobs::default()
    };
    if let Some(seed) = args.seed {
        knobs.seed = seed;
    }
    let mut scenarios = scenario::all(&knobs);
    if let Some(only) = &args.only {
        for name in only {
            if !scenarios.iter().any(|s| &s.name == name) {
                let known: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
                bail!("no scenario {name:?}; known: {}", known.join(", "));
            }
        }
        scenarios.retain(|s| only.contains(&s.name));
    }
    let started = Instant::now();
    // Scenarios are independent: run them on the machine's CPUs, longest first.
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Run>>>> =
        Mutex::new((0..scenarios.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(scenarios.len())
        .max(1);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(sc) = scenarios.get(i) else { break };
                let run = fleet::simulate(sc);
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(run);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    let mut runs = Vec::new();
    for (sc, r) in scenarios.iter().zip(results) {
        runs.push(r.with_context(|| format!("scenario {} did not run", sc.name))??);
    }
    let wall = started.elapsed();
    print!("{}", report::text_table(&report::rows(&runs)));
    println!();
    print!("{}", report::claims_text(&claims::claims(&runs)));
    let mut command = if args.quick {
        "cargo xtask sim -- --quick".to_string()
    } else {
        "cargo xtask sim".to_string()
    };
    if let Some(seed) = args.seed {
        let sep = if args.quick { "" } else { " --" };
        command += &format!("{sep} --seed {seed}");
    }
    report::write(&args.out, &runs, wall, &command)?;
    let simulated: u64 = runs.iter().map(|r| r.scenario.duration).sum();
    println!(
        "\n{} s ({:.1} h) simulated in {:.1} s; report: {}",
        simulated / 1_000_000_000,
        simulated as f64 / 3.6e12,
        wall.as_secs_f64(),
        args.out.join("report.md").display()
    );
    Ok(())
}
