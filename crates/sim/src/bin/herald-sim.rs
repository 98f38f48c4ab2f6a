//! `herald-sim`: run seeds of the deterministic simulation.
//!
//! ```text
//! herald-sim --seed 42                 one seed: its faults, counts, trace hash and verdict
//! herald-sim --seeds 1..200            a range of seeds (CI's budget)
//! herald-sim --for 600                 fresh seeds (from the clock) for ten minutes
//! options: --no-identity (epochs not bound to the broker's life: synchronous_persistence)
//!          --no-watermarks  --no-rollbacks  --trace (print every client's log)
//!          --chaos-ms N (faults for N simulated ms instead of 20,000)
//!          --no-stale-reads (by default 2 % of history reads are served from the stream as
//!          it was 10-300 ms earlier, as by a replica behind)
//! ```
//! A failing seed prints the one line that replays it and exits 1.

use std::time::Instant;

use herald_sim::{run, Options};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut options = Options::default();
    let mut flags = String::new();
    let mut seeds: Option<(u64, u64)> = None;
    let mut for_s: Option<u64> = None;
    let mut trace = false;
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seed" => {
                let s: u64 = value(i).parse().expect("--seed N");
                seeds = Some((s, s));
                i += 1;
            }
            "--seeds" => {
                let v = value(i);
                let (a, b) = v.split_once("..").expect("--seeds A..B");
                seeds = Some((a.parse().expect("A"), b.parse().expect("B")));
                i += 1;
            }
            "--for" => {
                for_s = Some(value(i).parse().expect("--for SECONDS"));
                i += 1;
            }
            "--no-identity" => {
                options.node.bind_identity = false;
                flags.push_str(" --no-identity");
            }
            "--no-watermarks" => {
                options.node.watermarks = false;
                flags.push_str(" --no-watermarks");
            }
            "--no-rollbacks" => {
                options.rollbacks = false;
                flags.push_str(" --no-rollbacks");
            }
            "--chaos-ms" => {
                options.chaos_ms = value(i).parse().expect("--chaos-ms N");
                flags.push_str(&format!(" --chaos-ms {}", options.chaos_ms));
                i += 1;
            }
            "--no-stale-reads" => {
                options.faults.stale_read = 0.0;
                flags.push_str(" --no-stale-reads");
            }
            "--trace" => trace = true,
            other => {
                eprintln!("unknown argument {other}; see the crate docs");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let started = Instant::now();
    let (first, last) = match (seeds, for_s) {
        (Some(r), _) => r,
        (None, Some(_)) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            let first = herald_sim::rng::Rng::new(t, "fresh").next_u64() >> 16;
            (first, u64::MAX)
        }
        (None, None) => (1, 1),
    };
    let mut ran = 0u64;
    let mut seed = first;
    loop {
        if let Some(s) = for_s {
            if started.elapsed().as_secs() >= s {
                break;
            }
        }
        let one = Instant::now();
        let report = run(seed, &options);
        ran += 1;
        let single = first == last;
        if single || trace {
            for (t, f) in &report.faults {
                println!("  {t:>6} ms  {f}");
            }
            println!(
                "seed {seed}: {} acknowledged ({} given up), {} delivered, {} told, broker {:?}, trace {:016x}, {:.1} s",
                report.acks,
                report.unacked,
                report.deliveries,
                report.told,
                report.server,
                report.trace_hash,
                one.elapsed().as_secs_f64()
            );
        }
        if trace {
            for log in &report.logs {
                println!("client {}:", log.client);
                for (t, e) in &log.events {
                    println!("  {t:>6} ms  {e:?}");
                }
            }
        }
        if !report.violations.is_empty() {
            println!("FAILED seed {seed}:");
            for v in report.violations.iter().take(10) {
                println!("  {v}");
            }
            println!("replay: {}", report.replay_command(&flags));
            println!(
                "{ran} seeds in {:.1} s, 1 failed",
                started.elapsed().as_secs_f64()
            );
            std::process::exit(1);
        }
        if seed == last {
            break;
        }
        seed += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{ran} seeds in {secs:.1} s ({:.2} seeds/s), first {first}, none failed",
        ran as f64 / secs
    );
}
