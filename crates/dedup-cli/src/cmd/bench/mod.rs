//! `dedup bench`: micro-workloads (Dmdedup §4.2.1) against the raw device
//! and dedup devices, all in one run, the systems alternating so drift hits
//! all alike; medians, spreads and ratios to the raw baseline; a table,
//! JSON, and an SVG chart.

mod client;
mod fio;
mod plot;
mod report;
mod systems;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::nbdkit::{find_plugin, find_program};
use super::shared::args::size_arg;
use super::shared::report::print_json;
use fio::{Dataset, Measured, Pattern, Phase};
use systems::{System, Tools};

#[derive(clap::Args)]
#[command(
    about = "Benchmark dedup backends against the raw device (fio over NBD), side by side",
    after_help = "Examples:\n  dedup bench --runtime 5\n  dedup bench --datasets tar,files --source ~/src/releases --systems raw,inram,lsm\n  dedup bench --systems raw,inram,disktable --cache 1,25,100 --patterns rand4k\n  dedup bench --preset dmdedup --plot backends.svg --out backends.json\n\nNeeds nbdkit and fio. Devices are created fresh for each run in --dir and removed after."
)]
pub struct Args {
    /// Systems: raw (nbdkit's file plugin on the same storage) and backends.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,sparse,inram,disktable,cowbtree,lsm"
    )]
    pub systems: Vec<String>,
    /// Metadata cache sizes for disktable, cowbtree and lsm, in percent of
    /// the metadata size (8 B per logical chunk + 48 B per physical chunk).
    #[arg(long, value_delimiter = ',', default_value = "25")]
    pub cache: Vec<f64>,
    /// cowbtree writes per transaction: 1 = every write, 0 = unlimited.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub txn: Vec<u64>,
    /// Compression of the dedup systems, each one a system of its own
    /// (none, lz4, zstd, zstd:LEVEL); e.g. --compression none,lz4,zstd.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub compression: Vec<String>,
    /// sparse: hash index budgets, each one a system of its own (e.g.
    /// --index-memory 1G,4M,1M to compare a full index with sampled ones).
    #[arg(long, value_delimiter = ',', value_parser = crate::cmd::shared::args::index_memory_arg)]
    pub index_memory: Vec<u64>,
    /// sparse: of each index budget, the bytes for the prefetch cache
    /// (default an eighth): to compare tables of different sizes behind
    /// the same cache.
    #[arg(long, value_parser = size_arg)]
    pub index_cache: Option<u64>,
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "unique,alldup"
    )]
    pub datasets: Vec<Dataset>,
    /// fio's write patterns (unique and alldup); tar and files are written
    /// as their client writes them.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "seq640k,rand4k"
    )]
    pub patterns: Vec<Pattern>,
    /// The dataset for `tar` and `files`: a directory (archived once with
    /// tar) or a tar file. `files` needs root, nbdfuse and mkfs.ext4. For
    /// `image`: any file, copied as it is.
    #[arg(long, value_name = "DIR|TAR|FILE")]
    pub source: Option<PathBuf>,
    /// Device size (logical = physical).
    #[arg(long, value_parser = size_arg, default_value = "4G")]
    pub size: u64,
    /// Each run writes the whole device once (as Dmdedup's), or stops after
    /// this many seconds.
    #[arg(long, default_value_t = 30)]
    pub runtime: u64,
    /// Repetitions of the whole matrix (medians and spreads over them).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    #[arg(long, default_value_t = 16)]
    pub iodepth: u32,
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// Send a FLUSH every N writes (0: only what the backend does itself).
    #[arg(long, default_value_t = 0)]
    pub flush_every: u32,
    /// Synchronous writes: every write carries FUA (nbdkit's fua filter
    /// forces it, for the raw baseline too).
    #[arg(long)]
    pub sync: bool,
    /// After each write run, read back what it wrote.
    #[arg(long)]
    pub read: bool,
    /// The Dmdedup §4.2.1 matrix: raw, inram, disktable and cowbtree at
    /// caches of 1, 25 and 100 %, cowbtree at 1, 1000 and unlimited writes
    /// per transaction, lsm at 25 %; both datasets and both patterns.
    #[arg(long, value_parser = ["dmdedup"])]
    pub preset: Option<String>,
    /// Where to create the devices (default: a new directory under /var/tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// nbdkit worker threads.
    #[arg(long, default_value_t = 16)]
    pub threads: u32,
    #[arg(long, env = "DEDUP_PLUGIN")]
    pub plugin: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG chart of throughput per system.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Save every run and the summary as JSON.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Report a file saved with --out again (table, --json, --plot)
    /// without running anything.
    #[arg(long, value_name = "FILE", conflicts_with = "out")]
    pub from: Option<PathBuf>,
}

/// The settings a report's header names, saved with the runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub size: u64,
    pub runtime: u64,
    pub repeat: u32,
    pub iodepth: u32,
    pub jobs: u32,
    pub flush_every: u32,
    #[serde(default)]
    pub sync: bool,
}

/// What --out writes and --from reads.
#[derive(Serialize, Deserialize)]
struct Saved {
    settings: Settings,
    runs: Vec<Run>,
    summary: Vec<report::Summary>,
}

/// Write the chart, then print the table or JSON.
fn report_out(a: &Args, settings: &Settings, summary: &[report::Summary]) -> anyhow::Result<()> {
    if let Some(path) = &a.plot {
        plot::draw(path, summary)?;
    }
    if a.json {
        print_json(&summary)?;
    } else {
        out!("{}", report::table(summary, settings));
    }
    Ok(())
}

/// --from: re-report a saved run.
fn report_saved(a: &Args, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let saved: Saved = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a file written by `dedup bench --out`",
            path.display()
        )
    })?;
    report_out(a, &saved.settings, &saved.summary)?;
    Ok(ExitCode::SUCCESS)
}

/// One run of one system.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    pub system: String,
    pub dataset: Dataset,
    pub pattern: Pattern,
    pub phase: Phase,
    pub repetition: u32,
    #[serde(flatten)]
    pub io: Measured,
    pub server_cpu_seconds: f64,
    pub dedup_ratio: Option<f64>,
    pub io_dedup_ratio: Option<f64>,
    pub metadata_reads: Option<u64>,
    pub metadata_writes: Option<u64>,
    pub metadata_syncs: Option<u64>,
    pub metadata_bytes_written: Option<u64>,
    /// Bytes the system holds on its data storage after the run: chunks in
    /// use for dedup, allocated blocks of the image file for raw.
    #[serde(default)]
    pub physical_bytes: Option<u64>,
    /// Mapped logical bytes per physical data byte in use.
    #[serde(default)]
    pub space_ratio: Option<f64>,
    #[serde(default)]
    pub metadata_bytes: Option<u64>,
    /// sparse: its hash index after the run (entries, RAM, sampling).
    #[serde(default)]
    pub hash_index: Option<dedup_core::backend::IndexFigures>,
}

fn expand(a: &Args) -> Vec<System> {
    let (systems, caches, txns): (Vec<String>, Vec<f64>, Vec<u64>) = match a.preset.as_deref() {
        Some(_) => (
            ["raw", "inram", "disktable", "cowbtree", "lsm"]
                .map(String::from)
                .to_vec(),
            vec![1.0, 25.0, 100.0],
            vec![1, 1000, 0],
        ),
        None => (a.systems.clone(), a.cache.clone(), a.txn.clone()),
    };
    let mut out = Vec::new();
    for s in &systems {
        match s.as_str() {
            "raw" => out.push(System::raw()),
            "inram" => out.push(System::dedup("inram", None, None)),
            "disktable" => out.extend(
                caches
                    .iter()
                    .map(|&c| System::dedup("disktable", Some(c), None)),
            ),
            "cowbtree" => {
                for &c in &caches {
                    out.extend(
                        txns.iter()
                            .map(|&t| System::dedup("cowbtree", Some(c), Some(t))),
                    );
                }
            }
            "lsm" if a.preset.is_some() => out.push(System::dedup("lsm", Some(25.0), None)),
            "lsm" => out.extend(caches.iter().map(|&c| System::dedup("lsm", Some(c), None))),
            // Every other backend (names were checked) with its defaults:
            // sparse, whose costs follow the data, and the thin family.
            other => out.push(System::dedup(other, None, None)),
        }
    }
    // Each dedup system once per compression asked for.
    let codecs = if a.preset.is_some() {
        vec!["none".to_string()]
    } else {
        a.compression.clone()
    };
    out.into_iter()
        .flat_map(|s| {
            if s.kind == "raw" {
                vec![s]
            } else {
                codecs
                    .iter()
                    .map(|c| {
                        s.clone()
                            .with_compression(c, codecs.len() > 1 || c != "none")
                    })
                    .collect()
            }
        })
        // Each sparse system once per index budget asked for.
        .flat_map(|s| {
            if s.kind != "sparse" || a.index_memory.is_empty() {
                vec![s]
            } else {
                a.index_memory
                    .iter()
                    .map(|&b| {
                        let mut s = s.clone().with_index_memory(b);
                        s.index_cache = a.index_cache;
                        s
                    })
                    .collect()
            }
        })
        .collect()
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(path) = &a.from {
        return report_saved(&a, path);
    }
    for s in &a.systems {
        if s != "raw" {
            dedup_core::registry::check_name(s)?;
        }
    }
    for c in &a.compression {
        dedup_core::compress::Compression::parse(c)?;
    }
    // The servers' info lines would drown the progress bar.
    if std::env::var_os("DEDUP_LOG").is_none() {
        std::env::set_var("DEDUP_LOG", "warn");
    }
    let systems = expand(&a);
    let (datasets, patterns) = match a.preset {
        Some(_) => (
            vec![Dataset::Unique, Dataset::Alldup],
            vec![Pattern::Seq640k, Pattern::Rand4k],
        ),
        None => (a.datasets.clone(), a.patterns.clone()),
    };
    if patterns.contains(&Pattern::Stream) {
        bail!("--patterns takes seq640k and rand4k; tar and files are written as their client writes them");
    }
    // (dataset, pattern) pairs in run order.
    let workloads: Vec<(Dataset, Pattern)> = datasets
        .iter()
        .flat_map(|&d| {
            if d.by_fio() {
                patterns.iter().map(|&p| (d, p)).collect::<Vec<_>>()
            } else {
                vec![(d, Pattern::Stream)]
            }
        })
        .collect();
    let tools = Tools {
        nbdkit: find_program(std::path::Path::new("nbdkit"))?,
        plugin: find_plugin(a.plugin.clone())?,
        threads: a.threads,
        sync: a.sync,
    };
    let fio =
        find_program(std::path::Path::new("fio")).context("fio is needed: apt-get install fio")?;
    let workdir = match &a.dir {
        Some(d) => d.clone(),
        None => tempfile::Builder::new()
            .prefix("dedup-bench-")
            .tempdir_in("/var/tmp")
            .context("creating a work directory in /var/tmp")?
            .keep(),
    };
    std::fs::create_dir_all(&workdir)?;
    // Declared first so it drops last: the work directory goes once empty,
    // however the run ends.
    let _dir_guard = RemoveOnDrop(workdir.clone());
    // Removed however the run ends (it can be gigabytes).
    let tar_guard = RemoveOnDrop(workdir.join("source.tar"));
    let image = datasets.contains(&Dataset::Image);
    if image
        && datasets
            .iter()
            .any(|d| matches!(d, Dataset::Tar | Dataset::Files))
    {
        bail!("--datasets image copies --source as it is, tar and files archive it: run them separately");
    }
    let tar = match (datasets.iter().any(|d| !d.by_fio()), &a.source) {
        (false, _) => None,
        (true, None) => bail!("the tar, files and image datasets need --source (a directory, a tar file, or for image any file)"),
        (true, Some(src)) => {
            let tar = if image {
                if !src.is_file() {
                    bail!("--datasets image needs --source FILE, a regular file: {} is not one", src.display());
                }
                src.clone()
            } else {
                client::tar_stream(src, &workdir)?
            };
            let len = std::fs::metadata(&tar)?.len();
            // ext4 needs room beyond the data: its metadata and journal.
            if len + len / 4 + (64 << 20) > a.size {
                bail!(
                    "the dataset's stream is {} but devices are {}: pass --size {} or more",
                    dedup_core::size::format_size(len),
                    dedup_core::size::format_size(a.size),
                    dedup_core::size::format_size(
                        (len + len / 4 + (64 << 20)).div_ceil(1 << 30) << 30
                    )
                );
            }
            Some(tar)
        }
    };
    let total = systems.len() * workloads.len() * a.repeat as usize;
    let bar = indicatif::ProgressBar::new(total as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg:40} [{bar:30}] {pos}/{len} runs, {eta} left",
        )?
        .progress_chars("=> "),
    );
    let mut runs = Vec::new();
    for rep in 0..a.repeat {
        for &(dataset, pattern) in &workloads {
            // Alternate the order so slow drift of the machine hits all systems alike.
            let order: Vec<&System> = if rep % 2 == 0 {
                systems.iter().collect()
            } else {
                systems.iter().rev().collect()
            };
            for system in order {
                bar.set_message(format!("{} {:?} {:?}", system.label, dataset, pattern));
                let w = Workload {
                    dataset,
                    pattern,
                    tar: tar.as_deref(),
                };
                runs.extend(one(&a, &fio, &tools, &workdir, system, &w, rep)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_file(workdir.join("fio.json"));
    drop(tar_guard);
    let summary = report::summarize(&systems, &runs);
    let settings = Settings {
        size: a.size,
        runtime: a.runtime,
        repeat: a.repeat,
        iodepth: a.iodepth,
        jobs: a.jobs,
        flush_every: a.flush_every,
        sync: a.sync,
    };
    if let Some(path) = &a.out {
        let saved = Saved {
            settings: settings.clone(),
            runs,
            summary,
        };
        std::fs::write(path, serde_json::to_string_pretty(&saved)?)
            .with_context(|| format!("writing {}", path.display()))?;
        report_out(&a, &settings, &saved.summary)?;
    } else {
        report_out(&a, &settings, &summary)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Deletes a file, or a directory if it is empty, when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// What one run writes.
struct Workload<'a> {
    dataset: Dataset,
    pattern: Pattern,
    /// The tar stream of --source (tar and files datasets).
    tar: Option<&'a std::path::Path>,
}

fn one(
    a: &Args,
    fio_bin: &std::path::Path,
    tools: &Tools,
    workdir: &std::path::Path,
    system: &System,
    w: &Workload,
    rep: u32,
) -> anyhow::Result<Vec<Run>> {
    let (dataset, pattern) = (w.dataset, w.pattern);
    let running = systems::start(system, workdir, a.size, tools)?;
    let result = (|| -> anyhow::Result<Vec<Run>> {
        let mut out = Vec::new();
        let mut span = a.size;
        // Reading back is measured for fio's datasets only.
        let phases: &[Phase] = if a.read && dataset.by_fio() {
            &[Phase::Write, Phase::Read]
        } else {
            &[Phase::Write]
        };
        for &phase in phases {
            let cpu_before = running.cpu_seconds();
            let io = match (dataset, w.tar) {
                (Dataset::Tar | Dataset::Image, Some(tar)) => client::write_tar(&running.uri, tar)?,
                (Dataset::Files, Some(tar)) => {
                    client::write_files(&running.uri, tar, &running.dir)?
                }
                _ => {
                    let job = fio::Job {
                        uri: &running.uri,
                        dataset,
                        pattern,
                        phase,
                        span,
                        runtime_s: a.runtime,
                        iodepth: a.iodepth,
                        jobs: a.jobs,
                        flush_every: a.flush_every,
                    };
                    fio::run(fio_bin, &job, &workdir.join("fio.json"))?
                }
            };
            if phase == Phase::Write {
                // Read back only what was written (never-written space reads
                // as zeros without I/O on a dedup device).
                let written = io.bytes.min(a.size);
                span = (written.max(1 << 20) / (1 << 20)) * (1 << 20);
            }
            if phase == Phase::Write && !dataset.by_fio() {
                // What the device holds once garbage collection (and
                // repacking) has given back what it can; not timed.
                running.gc()?;
            }
            let stats = running.stats()?;
            out.push(Run {
                system: system.label.clone(),
                dataset,
                pattern,
                phase,
                repetition: rep,
                io,
                server_cpu_seconds: running.cpu_seconds() - cpu_before,
                dedup_ratio: stats.as_ref().map(|s| s.dedup_ratio),
                io_dedup_ratio: stats.as_ref().map(|s| s.io_dedup_ratio),
                metadata_reads: stats.as_ref().map(|s| s.metadata_io.reads),
                metadata_writes: stats.as_ref().map(|s| s.metadata_io.writes),
                metadata_syncs: stats.as_ref().map(|s| s.metadata_io.syncs),
                metadata_bytes_written: stats.as_ref().map(|s| s.metadata_io.bytes_written),
                physical_bytes: match &stats {
                    Some(s) => Some(s.physical_bytes_used),
                    None => running.raw_allocated_bytes(),
                },
                space_ratio: stats.as_ref().map(|s| s.space_ratio),
                metadata_bytes: stats.as_ref().map(|s| s.metadata_bytes),
                hash_index: stats.as_ref().and_then(|s| s.hash_index),
            });
        }
        Ok(out)
    })();
    let finished = running.finish();
    let runs = result?;
    finished?;
    Ok(runs)
}
