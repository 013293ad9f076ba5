//! `dedup store`: the backup store's repository as a whole (issue 17):
//! `init` creates one, `stats` sums up what it holds, `check` verifies it
//! (in `store_check.rs`). gc and serve will join them. Also what the backup commands (`backup`, `restore`,
//! `list`, `delete`) share.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use dedup_core::compress::Compression;
use dedup_core::size::format_size;
use dedup_store::index::projection::hook_bytes_at;
use dedup_store::index::{IndexConfig, SamplingRate};
use dedup_store::repo::CONTAINERS_PREFIX;
use dedup_store::{
    BackupReport, Catalog, LocalDir, ObjectStore, RepoOptions, Repository, Segmenting,
};
use serde::Serialize;

use super::print_json;

#[derive(clap::Args)]
#[command(
    about = "Manage a backup repository: init, stats, check, serve, remote",
    after_help = "A repository is a directory of containers (compressed segments with catalogs), recipes and backups. serve holds it open for many concurrent backup clients; remote lists, restores, deletes, sums up and collects garbage through a server.\n\nExamples:\n  dedup store init ./repo\n  dedup store init ./repo --segments fastcdc\n  dedup store stats ./repo --json\n  dedup store check ./repo --data\n  dedup store serve ./repo --socket /run/dedup-backup.sock"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(clap::Subcommand)]
pub enum StoreCommand {
    Init(InitArgs),
    Stats(StatsArgs),
    Check(super::store_check::CheckArgs),
    Serve(super::store_serve::Args),
    Remote(super::store_remote::Args),
}

#[derive(clap::Args)]
#[command(
    about = "Create a backup repository in a directory",
    after_help = "How streams are cut into segments is fixed at init for the repository's life. The directory must be empty or absent unless --force; it is made owner-only (0700).\n\nExamples:\n  dedup store init ./repo\n  dedup store init ./repo --segments fastcdc --json\n  dedup store init ./repo --segments fastcdc:16K"
)]
pub struct InitArgs {
    /// Repository directory (created if absent).
    pub repo: PathBuf,
    /// How backups are cut into segments: fastcdc (the default:
    /// content-defined, 2-32 KiB averaging 8 KiB, finds data shifted by
    /// insertions, as in tar streams and edited files; on /usr/share and
    /// /usr/lib it stored 1,587 MB where fixed stored 1,718 MB, with 110 MB
    /// of peak RSS where fixed took 135 MB), fastcdc:AVG (AVG/4 to 4 AVG),
    /// fastcdc:AVG:MIN:MAX, fixed (4 KiB, the paper's: finds repeats at the
    /// same 4 KiB offsets only, as in disk images) or fixed:SIZE.
    #[arg(long, default_value = "fastcdc", value_parser = Segmenting::parse)]
    pub segments: Segmenting,
    /// How segments are compressed, in frames of about 1 MiB (zstd) or
    /// 128 KiB (lz4): zstd:LEVEL (1-22; higher is smaller and slower), zstd
    /// (level 3), lz4 or none. On a 2 GiB ext4 image on 2 cores, zstd:1
    /// (the default) stored 664 MB at 364 MB/s, zstd:3 623 MB at 219 MB/s,
    /// lz4 858 MB at 380 MB/s.
    #[arg(long, default_value = "zstd:1", value_parser = compression_arg)]
    pub compression: Compression,
    /// Create the repository even if the directory holds other files.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
#[command(
    about = "Show what a backup repository holds: backups, containers, bytes stored",
    after_help = "Bytes stored are the container files' sizes (compressed segments, catalogs, framing); logical bytes are the sum of the backups' stream lengths.\n\nExamples:\n  dedup store stats ./repo\n  dedup store stats ./repo --json"
)]
pub struct StatsArgs {
    /// Repository directory.
    pub repo: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.command {
        StoreCommand::Init(a) => init(a),
        StoreCommand::Stats(a) => stats(a),
        StoreCommand::Check(a) => super::store_check::run(a),
        StoreCommand::Serve(a) => super::store_serve::run(a),
        StoreCommand::Remote(a) => super::store_remote::run(a),
    }
}

#[derive(Serialize)]
struct InitReport {
    repository: PathBuf,
    segments: String,
    compression: String,
    container_target: u64,
    uuid: String,
}

fn compression_arg(s: &str) -> Result<Compression, String> {
    Compression::parse(s).map_err(|e| e.to_string())
}

fn init(a: InitArgs) -> anyhow::Result<ExitCode> {
    let segmenting = a.segments;
    let repo = Repository::init_with(
        &a.repo,
        RepoOptions {
            segmenting,
            compression: a.compression,
            force: a.force,
            ..RepoOptions::default()
        },
    )?;
    let config = repo.config();
    let report = InitReport {
        repository: a.repo.clone(),
        segments: segments_label(config.segmenting),
        compression: config.compression.to_string(),
        container_target: config.container_target,
        uuid: config.uuid.iter().map(|b| format!("{b:02x}")).collect(),
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!(
            "Created backup repository {} ({} segments, {} compression, {} containers).\nBack up a stream into it: tar -cf - DIR | dedup backup {} NAME --stdin",
            a.repo.display(),
            report.segments,
            report.compression,
            format_size(report.container_target),
            a.repo.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct StatsReport {
    repository: PathBuf,
    segments: String,
    backups: u64,
    containers: u64,
    /// Container bytes on disk.
    bytes_stored: u64,
    /// Sum of the backups' stream lengths.
    logical_bytes: u64,
    /// logical / stored; null when nothing is stored.
    fold_factor: Option<f64>,
    damaged_containers: Vec<String>,
    /// The sampled index as last checkpointed; null if there is none.
    index: Option<StatsIndex>,
}

#[derive(Serialize)]
struct StatsIndex {
    /// R, the sampling rate (1, 1/2, 1/4, ...).
    sampling_rate: f64,
    hooks: usize,
    /// RAM the hooks take.
    hook_bytes: u64,
    fingerprints: u64,
    /// Hook RAM per TiB of segments stored.
    hook_bytes_per_tib: Option<f64>,
}

fn stats(a: StatsArgs) -> anyhow::Result<ExitCode> {
    // Read-only: stats works beside a process that writes, and writes nothing.
    let repo = Repository::open_read_only(&a.repo)?;
    let listing = repo.list_backups_all()?;
    for d in &listing.damaged {
        eprintln!(
            "dedup store stats: backup {} is left out: {}",
            d.name, d.detail
        );
    }
    let backups = listing.backups;
    let store = LocalDir::open(&a.repo)?;
    let containers = store.list(CONTAINERS_PREFIX)?;
    let mut bytes_stored = 0;
    let mut damaged = Vec::new();
    for name in &containers {
        let id = name
            .strip_prefix(CONTAINERS_PREFIX)
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        if id.is_none_or(|id| Catalog::read(&store, id).is_err()) {
            damaged.push(name.clone());
        }
        let path = a.repo.join(name);
        bytes_stored += fs::metadata(&path)
            .with_context(|| format!("reading the size of {}", path.display()))?
            .len();
    }
    let logical_bytes: u64 = backups.iter().map(|b| b.report.bytes_in).sum();
    let report = StatsReport {
        repository: a.repo.clone(),
        segments: segments_label(repo.config().segmenting),
        backups: backups.len() as u64,
        containers: containers.len() as u64,
        bytes_stored,
        logical_bytes,
        fold_factor: (bytes_stored > 0).then(|| logical_bytes as f64 / bytes_stored as f64),
        damaged_containers: damaged,
        index: dedup_store::index::checkpoint_objects::newest_figures(&store).map(|f| {
            let stored = f.fingerprints as f64 * f64::from(segment_bytes(repo.config().segmenting));
            StatsIndex {
                sampling_rate: f.rate,
                hooks: f.hooks,
                hook_bytes: f.hook_bytes,
                fingerprints: f.fingerprints,
                hook_bytes_per_tib: (stored > 0.0)
                    .then(|| f.hook_bytes as f64 * (1u64 << 40) as f64 / stored),
            }
        }),
    };
    if a.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: {} backups, {} logical, {} stored in {} containers{} ({} segments).",
        a.repo.display(),
        report.backups,
        format_size(report.logical_bytes),
        format_size(report.bytes_stored),
        report.containers,
        report
            .fold_factor
            .map(|f| format!(", folded {f:.2}x"))
            .unwrap_or_default(),
        report.segments
    );
    if !report.damaged_containers.is_empty() {
        println!(
            "Damaged containers (restores that need them fail): {}",
            report.damaged_containers.join(", ")
        );
    }
    if let Some(i) = &report.index {
        println!(
            "Index (as last checkpointed): {} hooks at R = 1/{:.0} for {} segments: {} of RAM{}.",
            i.hooks,
            1.0 / i.sampling_rate,
            i.fingerprints,
            format_size(i.hook_bytes),
            i.hook_bytes_per_tib
                .map(|b| format!(", {} per TiB stored", format_size(b as u64)))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A backup's report as `backup --json` and `list --json` give it: the
/// store's figures, and the ratio as JSON can hold it.
#[derive(Serialize)]
pub struct ReportJson {
    #[serde(flatten)]
    pub counts: BackupReport,
    /// Bytes in per new byte; null when nothing new was stored.
    pub dedup_ratio: Option<f64>,
}

impl From<BackupReport> for ReportJson {
    fn from(counts: BackupReport) -> ReportJson {
        let ratio = counts.dedup_ratio();
        ReportJson {
            counts,
            dedup_ratio: ratio.is_finite().then_some(ratio),
        }
    }
}

/// How a writing command indexes the repository's segments.
#[derive(clap::Args, Clone, Debug)]
pub struct IndexArgs {
    /// RAM for the sampled index's hooks (Guo §3.2), at most 41 bytes a
    /// hook. Every fingerprint is a hook while they fit (the first 3.1 GiB
    /// stored, by default); past that the sampling rate halves as the
    /// store grows (R = 1, 1/2, 1/4, ...: 1/512 at 1 TiB), and a hit on a
    /// sampled fingerprint prefetches its container's catalog.
    #[arg(long, default_value = "32M", value_parser = super::index_memory_arg)]
    pub index_memory: u64,
    /// Fingerprints the prefetch cache holds, 24 bytes each (0: no
    /// prefetch). The default, 24 MiB, holds the catalogs of about 128
    /// containers of 4 KiB segments.
    #[arg(long, default_value_t = 1 << 20)]
    pub index_cache: usize,
    /// Sample at most this densely, whatever the budget allows: 1 (the
    /// budget decides), 1/2, 1/4, ... 1/128 ... (a power of two), to
    /// trade dedup for RAM as Guo's Table 4 does.
    #[arg(long, default_value = "1", value_parser = sampling_arg)]
    pub index_sampling: SamplingRate,
    /// Keep every fingerprint in RAM instead (about 60 bytes a segment),
    /// rebuilt from every catalog at open.
    #[arg(long)]
    pub exact_index: bool,
}

impl IndexArgs {
    pub fn config(&self) -> IndexConfig {
        IndexConfig {
            memory_budget: self.index_memory,
            cache_entries: self.index_cache,
            max_rate: self.index_sampling,
            ..IndexConfig::default()
        }
    }
}

/// `1` or `1/T` for a power of two T.
fn sampling_arg(s: &str) -> Result<SamplingRate, String> {
    let period: u64 = match s.trim().strip_prefix("1/") {
        Some(t) => t
            .parse()
            .map_err(|_| format!("{s:?}: give 1 or 1/T, e.g. 1/16"))?,
        None if s.trim() == "1" => 1,
        None => return Err(format!("{s:?}: give 1 or 1/T, e.g. 1/16")),
    };
    if !period.is_power_of_two() {
        return Err(format!(
            "{s:?}: T must be a power of two (1/16, 1/128, ...)"
        ));
    }
    SamplingRate::from_log2_period(period.trailing_zeros())
        .ok_or_else(|| format!("{s:?}: too sparse"))
}

/// Open `dir` to write (backup, delete, gc) with the index `index` asks for.
pub fn open_indexed(dir: &Path, index: &IndexArgs) -> anyhow::Result<Repository> {
    if index.exact_index {
        return open(dir);
    }
    Ok(Repository::open_sampled(dir, index.config())?)
}

/// What the index cost, for reports: RAM, and RAM per TiB of segments
/// stored (the paper's figure of merit for an index).
#[derive(Serialize, Clone, Copy, Debug)]
pub struct IndexJson {
    /// RAM of the tables that grow with the store (hooks, or the exact map).
    pub index_ram_bytes: u64,
    /// RAM of the fixed-size prefetch cache.
    pub index_cache_bytes: u64,
    pub index_fingerprints: u64,
    /// RAM now over the bytes stored now, per TiB; null before anything
    /// is stored. Not what 1 TiB will cost a sampled index: see
    /// `index_ram_at_1_tib`.
    pub index_ram_per_tib: Option<f64>,
    /// What a sampled index will hold at 1 TiB stored, by its sampling
    /// rule within its budget (null for an exact index, which grows with
    /// the store).
    pub index_ram_at_1_tib: Option<u64>,
}

impl IndexJson {
    pub fn of(repo: &Repository) -> Option<IndexJson> {
        let ram = repo.index_ram()?;
        let config = repo.config();
        let segment = u64::from(segment_bytes(config.segmenting));
        let stored = ram.fingerprints as f64 * segment as f64;
        Some(IndexJson {
            index_ram_bytes: ram.bytes,
            index_cache_bytes: ram.cache_bytes,
            index_fingerprints: ram.fingerprints,
            index_ram_per_tib: (stored > 0.0)
                .then(|| ram.bytes as f64 * (1u64 << 40) as f64 / stored),
            index_ram_at_1_tib: ram
                .budget
                .map(|budget| hook_bytes_at(1 << 40, budget, segment, config.container_target)),
        })
    }

    /// The report's line about the index: what it holds now, and for a
    /// sampled index what it will hold at 1 TiB (not now's RAM scaled up:
    /// below a few GiB every fingerprint is a hook, which sampling will
    /// not keep).
    pub fn text(&self) -> String {
        let later = match (self.index_ram_at_1_tib, self.index_ram_per_tib) {
            (Some(b), _) => format!(
                " (sampled within its budget: {} at 1 TiB stored)",
                format_size(b)
            ),
            (None, Some(b)) => format!(" ({} per TiB stored)", format_size(b as u64)),
            (None, None) => String::new(),
        };
        format!(
            "Index: {} of RAM for {} segments{}, and a {} prefetch cache.",
            format_size(self.index_ram_bytes),
            self.index_fingerprints,
            later,
            format_size(self.index_cache_bytes)
        )
    }

    pub fn print(&self) {
        println!("{}", self.text());
    }
}

/// A backup's dedup ratio in words.
pub fn ratio_text(r: &BackupReport) -> String {
    let ratio = r.dedup_ratio();
    if ratio.is_finite() {
        format!("{ratio:.2}")
    } else {
        "infinite (nothing new)".into()
    }
}

/// A segment's expected size.
fn segment_bytes(s: Segmenting) -> u32 {
    match s {
        Segmenting::Fixed { size } => size,
        Segmenting::FastCdc { avg, .. } => avg,
    }
}

/// Open `dir` to write (backup, delete): one writing process at a time.
pub fn open(dir: &Path) -> anyhow::Result<Repository> {
    Ok(Repository::open(dir)?)
}

/// Open `dir` to read (list, restore, stats): no lock, no index, so it
/// works beside a process that writes.
pub fn open_read_only(dir: &Path) -> anyhow::Result<Repository> {
    Ok(Repository::open_read_only(dir)?)
}

pub fn segments_label(s: Segmenting) -> String {
    match s {
        Segmenting::Fixed { size } => format!("fixed {}", format_size(size.into())),
        Segmenting::FastCdc { min, avg, max } => format!(
            "FastCDC {}-{} avg {}",
            format_size(min.into()),
            format_size(max.into()),
            format_size(avg.into())
        ),
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_767_225_599), "2025-12-31 23:59:59 UTC");
    }
}
