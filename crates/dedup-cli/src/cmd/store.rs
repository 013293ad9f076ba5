//! `dedup store`: the backup store's repository as a whole (issue 17):
//! `init` creates one, `stats` sums up what it holds, `check` verifies it
//! (in `store_check.rs`), `serve` serves it (`store_serve.rs`),
//! `remote` reaches it through a server (`store_remote.rs`) and `key`
//! manages an encrypted repository's passphrases (`store_key.rs`).

use std::process::ExitCode;

use dedup_core::compress::Compression;
use dedup_core::size::format_size;
use dedup_store::crypto::KdfParams;
use dedup_store::repo::CONTAINERS_PREFIX;
use dedup_store::{Catalog, RepoLocation, RepoOptions, Repository, Segmenting};
use serde::Serialize;

use super::shared::args::compression_arg;
use super::shared::report::{print_json, segment_bytes, segments_label};

#[derive(clap::Args)]
#[command(
    about = "Manage a backup repository: init, stats, check, serve, remote, key",
    after_help = "A repository is a directory, or a prefix in an S3 bucket (s3://BUCKET/PREFIX), of containers (compressed segments with catalogs), recipes and backups. serve holds it open for many concurrent backup clients; remote lists, restores, deletes, sums up and collects garbage through a server.\n\nExamples:\n  dedup store init ./repo\n  dedup store init s3://backups/hosts\n  dedup store init ./repo --segments fastcdc\n  dedup store stats ./repo --json\n  dedup store check ./repo --data\n  dedup store serve ./repo --socket /run/dedup-backup.sock"
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
    Key(super::store_key::Args),
}

#[derive(clap::Args)]
#[command(
    about = "Create a backup repository in a directory or an S3 bucket",
    after_help = "How streams are cut into segments is fixed at init for the repository's life. The directory must be empty or absent unless --force; it is made owner-only (0700). In a bucket (s3://BUCKET/PREFIX; the bucket must exist), nothing may be under PREFIX/ unless --force; endpoint, region and credentials come from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, else from the profile AWS_PROFILE (or default) in ~/.aws/credentials and ~/.aws/config (AWS_ALLOW_HTTP=true for a test server on loopback).\n\nExamples:\n  dedup store init ./repo\n  dedup store init ./repo --segments fastcdc --json\n  dedup store init ./repo --segments fastcdc:16K\n  AWS_ENDPOINT_URL=http://127.0.0.1:8333 AWS_ALLOW_HTTP=true dedup store init s3://backups/hosts"
)]
pub struct InitArgs {
    /// Repository: a directory (created if absent) or s3://BUCKET/PREFIX.
    pub repo: RepoLocation,
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
    /// Encrypt every object (AES-256-GCM-SIV under a random master
    /// key, wrapped under the passphrase with Argon2id) and key the
    /// segments' fingerprints: on (the default for s3://) or off (the
    /// default for a directory). The passphrase comes from
    /// --password-file FILE, DEDUP_PASSWORD or DEDUP_PASSWORD_FILE;
    /// without it nothing in the repository can be read.
    #[arg(long, value_parser = ["on", "off"])]
    pub encryption: Option<String>,
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
    /// Repository: a directory or s3://BUCKET/PREFIX.
    pub repo: RepoLocation,
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
        StoreCommand::Key(a) => super::store_key::run(a),
    }
}

#[derive(Serialize)]
struct InitReport {
    repository: String,
    segments: String,
    compression: String,
    container_target: u64,
    uuid: String,
    encrypted: bool,
}

fn init(a: InitArgs) -> anyhow::Result<ExitCode> {
    let segmenting = a.segments;
    let encrypt = match a.encryption.as_deref() {
        Some(on) => on == "on",
        None => a.repo.dir().is_none(),
    };
    let repo = Repository::init_with(
        &a.repo,
        RepoOptions {
            segmenting,
            compression: a.compression,
            force: a.force,
            encryption: encrypt.then_some(KdfParams::DEFAULT),
            ..RepoOptions::default()
        },
    )?;
    let config = repo.config();
    let report = InitReport {
        repository: a.repo.to_string(),
        segments: segments_label(config.segmenting),
        compression: config.compression.to_string(),
        container_target: config.container_target,
        uuid: config.uuid.iter().map(|b| format!("{b:02x}")).collect(),
        encrypted: repo.is_encrypted(),
    };
    if a.json {
        print_json(&report)?;
    } else {
        outln!(
            "Created {}backup repository {} ({} segments, {} compression, {} containers).\nBack up a stream into it: tar -cf - DIR | dedup backup {} NAME --stdin",
            if report.encrypted { "encrypted " } else { "" },
            a.repo,
            report.segments,
            report.compression,
            format_size(report.container_target),
            a.repo
        );
        if report.encrypted {
            outln!("Keep the passphrase safe: without it nothing in the repository can be read. Add another with: dedup store key add {}", a.repo);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct StatsReport {
    repository: String,
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
    let store = repo.object_store();
    // One listing gives the sizes (a directory is asked per file).
    let containers = store.list_sized(CONTAINERS_PREFIX)?;
    let mut bytes_stored = 0;
    let mut damaged = Vec::new();
    for (name, size) in &containers {
        let id = name
            .strip_prefix(CONTAINERS_PREFIX)
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        if id.is_none_or(|id| Catalog::read(&*store, id).is_err()) {
            damaged.push(name.clone());
        }
        bytes_stored += size;
    }
    let logical_bytes: u64 = backups.iter().map(|b| b.report.bytes_in).sum();
    let report = StatsReport {
        repository: a.repo.to_string(),
        segments: segments_label(repo.config().segmenting),
        backups: backups.len() as u64,
        containers: containers.len() as u64,
        bytes_stored,
        logical_bytes,
        fold_factor: (bytes_stored > 0).then(|| logical_bytes as f64 / bytes_stored as f64),
        damaged_containers: damaged,
        index: dedup_store::index::checkpoint_objects::newest_figures(&*store).map(|f| {
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
    outln!(
        "{}: {} backups, {} logical, {} stored in {} containers{} ({} segments).",
        a.repo,
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
        outln!(
            "Damaged containers (restores that need them fail): {}",
            report.damaged_containers.join(", ")
        );
    }
    if let Some(i) = &report.index {
        outln!(
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
