//! `dedup bench-thin`: ThinDedup's evaluation (§III, Figures 3, 6, 7 and
//! 8) on this machine. Synchronous writes: a client writes 4 KiB blocks
//! from the workload generator and flushes after every window's worth, so
//! each flush ends one window; throughput and request latency for `thin`,
//! `ordered`, `ideal` and `cowbtree` (one commit per flush) across window
//! sizes, dedup ratios and compressibility, random and sequential; and
//! the metadata blocks thin writes against `ordered`, which embeds nothing.
//!
//! The devices are files in `--dir` driven in-process through the engine
//! (no NBD), so what differs between systems is the metadata path alone.

mod plot;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use dedup_core::backends::WindowParams;
use dedup_core::backends::{BackendParams, OpenOptions};
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_trace::workload::{Access, Workload, WorkloadParams};
use serde::Serialize;

use super::shared::args::size_arg;
use super::shared::report::print_json;

#[derive(clap::Args)]
#[command(
    about = "ThinDedup's Figures 3, 6, 7 and 8: window persistence against ordered writes, in-memory metadata and cowbtree",
    after_help = "Example:\n  dedup bench-thin --dir /var/tmp/bt --plot docs/bench/thin.svg --out docs/bench/thin.json"
)]
pub struct Args {
    /// Where the devices are created (files; removed afterwards).
    #[arg(long, default_value = "/var/tmp/dedup-bench-thin")]
    pub dir: PathBuf,
    /// Data written per run.
    #[arg(long, default_value = "16M", value_parser = size_arg)]
    pub size: u64,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "thin,ordered,ideal,cowbtree"
    )]
    pub systems: Vec<String>,
    /// Window sizes (blocks per flush) for Figure 3.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
    pub windows: Vec<u64>,
    /// Dedup ratios for Figure 6.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub ratios: Vec<f64>,
    /// Shares of compressible blocks for Figures 7 and 8.
    #[arg(long, value_delimiter = ',', default_value = "0,0.25,0.5,0.75,1")]
    pub compressible: Vec<f64>,
    #[arg(long)]
    pub json: bool,
    /// Save the results.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw the figures (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One run's setting.
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    pub figure: &'static str,
    pub system: String,
    pub window: u64,
    pub dedup_ratio: f64,
    pub compressible: f64,
    pub access: Access,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub setting: Setting,
    pub mb_per_s: f64,
    pub writes_per_s: f64,
    /// Per request (writes and flushes), in microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Per flush (the end of a window), in microseconds.
    pub flush_p50_us: f64,
    pub metadata_writes: u64,
    pub metadata_syncs: u64,
    /// thin's metadata blocks (ordered: all its entries; thin: those no
    /// C-block had room for).
    pub metadata_blocks: u64,
    pub entries: u64,
    pub entries_embedded: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn run_one(a: &Args, s: &Setting) -> anyhow::Result<Outcome> {
    let dir = a.dir.join("dev");
    let _ = std::fs::remove_dir_all(&dir);
    let blocks = a.size / 4096;
    let mut opts = CreateOptions::new(blocks * 4096);
    // Room to spare: dedup ratio 1 fills a device of the logical size.
    opts.physical_size = Some(blocks * 4096 * 5 / 4);
    opts.backend = s.system.clone();
    opts.params = BackendParams {
        window: WindowParams {
            blocks: s.window,
            ms: 60_000,
        },
        // cowbtree: one transaction per flush, like a window.
        txn_writes: 0,
        ..BackendParams::default()
    };
    layout::create(&dir, &opts).with_context(|| format!("creating a {} device", s.system))?;
    let dev = layout::open(
        &DevicePaths::from_dir(&dir)?,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )?;
    let work = Workload::new(WorkloadParams {
        seed: 11,
        blocks,
        block_size: 4096,
        dedup_ratio: s.dedup_ratio,
        compressible_share: s.compressible,
        compression_ratio: 2.0,
        access: s.access,
        span_blocks: blocks,
    })
    .map_err(anyhow::Error::msg)?;
    // The bytes first, so generating them is not timed.
    let writes: Vec<(u64, Vec<u8>)> = work.collect();
    let mut lat = Vec::with_capacity(writes.len() + writes.len() / s.window as usize + 1);
    let mut flush_lat = Vec::new();
    let started = Instant::now();
    for (i, (lbn, b)) in writes.iter().enumerate() {
        let t = Instant::now();
        dev.write(lbn * 4096, b, false)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        if (i as u64 + 1) % s.window == 0 || i + 1 == writes.len() {
            let t = Instant::now();
            dev.flush()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            lat.push(us);
            flush_lat.push(us);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let st = dev.stats();
    dev.close()?;
    drop(dev);
    std::fs::remove_dir_all(&dir).ok();
    lat.sort_by(f64::total_cmp);
    flush_lat.sort_by(f64::total_cmp);
    let extra = |k: &str| st.backend_stats.get(k).copied().unwrap_or(0);
    Ok(Outcome {
        setting: s.clone(),
        mb_per_s: (blocks * 4096) as f64 / 1e6 / secs,
        writes_per_s: blocks as f64 / secs,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        flush_p50_us: percentile(&flush_lat, 0.5),
        metadata_writes: st.metadata_io.writes,
        metadata_syncs: st.metadata_io.syncs,
        metadata_blocks: extra("metadata_blocks_written"),
        entries: extra("entries"),
        entries_embedded: extra("entries_embedded"),
    })
}

fn settings(a: &Args) -> Vec<Setting> {
    let mut out = Vec::new();
    let one = |figure, system: &String, window, dedup_ratio, compressible, access| Setting {
        figure,
        system: system.clone(),
        window,
        dedup_ratio,
        compressible,
        access,
    };
    for access in [Access::Random, Access::Sequential] {
        let fig = if access == Access::Random {
            "3-random"
        } else {
            "3-sequential"
        };
        for &w in &a.windows {
            for sys in &a.systems {
                out.push(one(fig, sys, w, 2.0, 0.5, access));
            }
        }
    }
    for &r in &a.ratios {
        for sys in &a.systems {
            out.push(one("6", sys, 32, r, 0.5, Access::Random));
        }
    }
    for &c in &a.compressible {
        for sys in &a.systems {
            out.push(one("7", sys, 32, 2.0, c, Access::Random));
        }
    }
    out
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let all = settings(&a);
    let bar = indicatif::ProgressBar::new(all.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{pos}/{len} runs [{bar:30}] {msg} {eta} left")?
            .progress_chars("=> "),
    );
    let mut results = Vec::new();
    for s in &all {
        bar.set_message(format!("fig {} {} w{}", s.figure, s.system, s.window));
        results.push(run_one(&a, s)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    std::fs::remove_dir_all(&a.dir).ok();
    if let Some(p) = &a.out {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        plot::draw(p, &results)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        print_json(&results)?;
    } else {
        out!("{}", table(&results));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per run, grouped by figure.
pub fn table(r: &[Outcome]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let mut last = "";
    for x in r {
        let s = &x.setting;
        if s.figure != last {
            last = s.figure;
            let _ = writeln!(
                o,
                "\nFigure {}: {:<9} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9}",
                s.figure,
                "system",
                "window",
                "dedup",
                "compr",
                "MB/s",
                "p50 µs",
                "p99 µs",
                "meta wr",
                "mblocks",
                "embedded"
            );
        }
        let _ = writeln!(
            o,
            "           {:<9} {:>6} {:>6.0} {:>5.0}% {:>9.1} {:>9.0} {:>9.0} {:>10} {:>8} {:>8.0}%",
            s.system,
            s.window,
            s.dedup_ratio,
            s.compressible * 100.0,
            x.mb_per_s,
            x.p50_us,
            x.p99_us,
            x.metadata_writes,
            x.metadata_blocks,
            if x.entries > 0 {
                100.0 * x.entries_embedded as f64 / x.entries as f64
            } else {
                0.0
            }
        );
    }
    o
}
