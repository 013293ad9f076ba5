//! `dedup gc`: free chunks that only the hash index still references,
//! online (through the serving process) or offline; or, given a backup
//! repository, collect its garbage (`gc_repo.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::control::Request;
use dedup_core::engine::GcReport;
use dedup_core::OpenOptions;

use super::shared::args::percent;
use super::shared::device::{reach, Reached};
use super::shared::report::print_json;
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Run garbage collection: free chunks no LBN references any more, or a backup repository's unreferenced containers",
    after_help = "On a device: works while the device is served (online) or stopped (offline).\n\nOn a backup repository: deletes the containers, recipes and trees no backup needs any more (after `dedup delete`) and rewrites containers that are mostly dead (--compact-below), marking again only the backup groups that changed since the last collection. Backups may run beside it in any process on any host (there is no lock): before each of its two collections it waits (at most --writer-wait seconds) for writers still behind to look at the newest one, so that a collection does not stop their backups.\n\nExamples:\n  dedup gc ./dev\n  dedup gc ./dev --json\n  dedup gc ./repo --json\n  dedup gc ./repo --compact-below 30"
)]
pub struct Args {
    /// Device directory, or backup repository (a directory or
    /// s3://BUCKET/PREFIX).
    pub dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Repositories only: rewrite containers whose live share of stored
    /// bytes is below PERCENT (default 50; 0 never compacts; `%` allowed).
    #[arg(long, value_name = "PERCENT", value_parser = percent)]
    pub compact_below: Option<f64>,
    /// Repositories only: wait at most SECONDS, before each collection,
    /// for backups in other processes to look at the newest (pacing
    /// only: a backup that does not is stopped, never loses data).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = seconds)]
    pub writer_wait: f64,
}

/// A non-negative number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("{s} is not a number of seconds from 0 to 86400")),
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(repo) = super::gc_repo::repository_at(&a.dir)? {
        let wait = std::time::Duration::from_secs_f64(a.writer_wait);
        return super::gc_repo::run(&repo, a.compact_below, wait, a.json);
    }
    if a.compact_below.is_some() {
        anyhow::bail!(
            "--compact-below is for backup repositories; {} is not one (a device's gc repacks on its own)",
            a.dir.display()
        );
    }
    let report: GcReport = match reach(
        &a.dir,
        &Request::Gc,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )? {
        Reached::Served(v) => serde_json::from_value(v)?,
        Reached::Offline(dev) => {
            let r = dev.gc()?;
            dev.close()?;
            r
        }
    };
    if a.json {
        print_json(&report)?;
    } else {
        outln!("{}", render::gc(&report));
    }
    Ok(ExitCode::SUCCESS)
}
