//! Medians, spreads and ratios to the raw baseline, and the terminal table.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::fio::{Dataset, Pattern, Phase};
use super::systems::System;
use super::{Run, Settings};

/// One system on one workload, over all repetitions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    pub system: String,
    pub dataset: Dataset,
    pub pattern: Pattern,
    pub phase: Phase,
    pub runs: usize,
    pub mb_per_s: f64,
    pub mb_per_s_min: f64,
    pub mb_per_s_max: f64,
    /// Median throughput divided by the raw baseline's median, same workload.
    pub vs_raw: Option<f64>,
    pub iops: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    pub server_cpu_seconds: f64,
    pub dedup_ratio: Option<f64>,
    pub io_dedup_ratio: Option<f64>,
    pub metadata_writes: Option<u64>,
    pub metadata_syncs: Option<u64>,
    pub metadata_bytes_written: Option<u64>,
    /// Data bytes held after the run (dedup: chunks in use; raw: allocated).
    #[serde(default)]
    pub physical_bytes: Option<u64>,
    /// The raw baseline's data bytes divided by this system's.
    #[serde(default)]
    pub stored_vs_raw: Option<f64>,
    /// Mapped logical bytes per physical data byte (dedup and compression).
    #[serde(default)]
    pub space_ratio: Option<f64>,
    /// Bytes of metadata the device holds.
    #[serde(default)]
    pub metadata_bytes: Option<u64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn summarize(systems: &[System], runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(Dataset, Pattern, Phase)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.dataset, r.pattern, r.phase)) {
            keys.push((r.dataset, r.pattern, r.phase));
        }
    }
    let mut out = Vec::new();
    for (dataset, pattern, phase) in keys {
        let mut group = Vec::new();
        for s in systems {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| {
                    r.system == s.label
                        && r.dataset == dataset
                        && r.pattern == pattern
                        && r.phase == phase
                })
                .collect();
            if rs.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
            let mo = |f: &dyn Fn(&Run) -> Option<f64>| {
                let v: Vec<f64> = rs.iter().filter_map(|r| f(r)).collect();
                (!v.is_empty()).then(|| median(v))
            };
            let mb: Vec<f64> = rs.iter().map(|r| r.io.mb_per_s).collect();
            group.push(Summary {
                system: s.label.clone(),
                dataset,
                pattern,
                phase,
                runs: rs.len(),
                mb_per_s: median(mb.clone()),
                mb_per_s_min: mb.iter().copied().fold(f64::INFINITY, f64::min),
                mb_per_s_max: mb.iter().copied().fold(0.0, f64::max),
                vs_raw: None,
                iops: m(&|r| r.io.iops),
                lat_p50_us: m(&|r| r.io.lat_p50_us),
                lat_p99_us: m(&|r| r.io.lat_p99_us),
                lat_p999_us: m(&|r| r.io.lat_p999_us),
                server_cpu_seconds: m(&|r| r.server_cpu_seconds),
                dedup_ratio: mo(&|r| r.dedup_ratio),
                io_dedup_ratio: mo(&|r| r.io_dedup_ratio),
                metadata_writes: mo(&|r| r.metadata_writes.map(|v| v as f64)).map(|v| v as u64),
                metadata_syncs: mo(&|r| r.metadata_syncs.map(|v| v as f64)).map(|v| v as u64),
                metadata_bytes_written: mo(&|r| r.metadata_bytes_written.map(|v| v as f64))
                    .map(|v| v as u64),
                physical_bytes: mo(&|r| r.physical_bytes.map(|v| v as f64)).map(|v| v as u64),
                stored_vs_raw: None,
                space_ratio: mo(&|r| r.space_ratio),
                metadata_bytes: mo(&|r| r.metadata_bytes.map(|v| v as f64)).map(|v| v as u64),
            });
        }
        let raw = group.iter().find(|g| g.system == "raw");
        let (raw_mb, raw_bytes) = (raw.map(|g| g.mb_per_s), raw.and_then(|g| g.physical_bytes));
        for g in &mut group {
            g.vs_raw = raw_mb.filter(|&r| r > 0.0).map(|r| g.mb_per_s / r);
            g.stored_vs_raw = raw_bytes
                .zip(g.physical_bytes)
                .filter(|&(_, b)| b > 0)
                .map(|(r, b)| r as f64 / b as f64);
        }
        out.extend(group);
    }
    out
}

/// A workload's name in tables and charts.
pub fn workload_title(s: &Summary) -> String {
    match s.dataset {
        Dataset::Tar => "tar stream of --source, nbdcopy".into(),
        Dataset::Files => "--source extracted onto ext4, to sync".into(),
        Dataset::Image => "--source image, nbdcopy".into(),
        _ => format!("{:?} data, {:?}, {:?}", s.dataset, s.pattern, s.phase),
    }
}

pub fn table(summary: &[Summary], a: &Settings) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "dedup bench: {} per run, {} repetition(s), iodepth {}, {} job(s){}{}",
        dedup_core::size::format_size(a.size),
        a.repeat,
        a.iodepth,
        a.jobs,
        if a.flush_every > 0 {
            format!(", FLUSH every {} writes", a.flush_every)
        } else {
            String::new()
        },
        if a.sync { ", every write FUA" } else { "" }
    );
    let mut last = None;
    for s in summary {
        let key = (s.dataset, s.pattern, s.phase);
        if last != Some(key) {
            let _ = writeln!(o, "\n{}:", workload_title(s));
            let _ = writeln!(
                o,
                "  {:<24} {:>9} {:>13} {:>7} {:>9} {:>8} {:>8} {:>9} {:>6} {:>6} {:>9} {:>10} {:>7} {:>7} {:>9}",
                "system",
                "MB/s",
                "(min-max)",
                "x raw",
                "IOPS",
                "p50 us",
                "p99 us",
                "p99.9 us",
                "CPU s",
                "dedup",
                "meta wr",
                "stored",
                "raw/st",
                "space",
                "meta"
            );
            last = Some(key);
        }
        let opt =
            |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
        // Real clients (tar, files) give throughput only.
        let fio = |v: f64| {
            if s.pattern == Pattern::Stream {
                "-".to_string()
            } else {
                format!("{v:.0}")
            }
        };
        let _ = writeln!(
            o,
            "  {:<24} {:>9.1} {:>13} {:>7} {:>9} {:>8} {:>8} {:>9} {:>6.1} {:>6} {:>9} {:>10} {:>7} {:>7} {:>9}",
            s.system,
            s.mb_per_s,
            format!("({:.0}-{:.0})", s.mb_per_s_min, s.mb_per_s_max),
            opt(s.vs_raw, 2),
            fio(s.iops),
            fio(s.lat_p50_us),
            fio(s.lat_p99_us),
            fio(s.lat_p999_us),
            s.server_cpu_seconds,
            opt(s.dedup_ratio, 2),
            s.metadata_writes.map_or("-".to_string(), |v| v.to_string()),
            s.physical_bytes
                .map_or("-".to_string(), dedup_core::size::format_size),
            opt(s.stored_vs_raw, 2),
            opt(s.space_ratio, 2),
            s.metadata_bytes
                .map_or("-".to_string(), dedup_core::size::format_size),
        );
    }
    o
}
