//! `dedup restore REPO NAME DIR` for a backup of files: recreate them
//! with their metadata under DIR (the store's `Repository::restore_tree`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use dedup_core::size::format_size;
use dedup_store::{RepoLocation, Repository, RestoreOptions, RestoreReport};
use serde::Serialize;

use super::shared::report::{mb_per_sec, print_json};

#[derive(Serialize)]
struct Report {
    name: String,
    target: String,
    #[serde(flatten)]
    report: RestoreReport,
    seconds: f64,
    mb_per_sec: f64,
}

/// Restore backup `name` of `repo` (at `location`) under `target`: `dedup
/// restore`'s arguments, taken apart by `restore.rs`.
pub fn run(
    repo: &Repository,
    location: &RepoLocation,
    name: &str,
    target: &Path,
    include: &[PathBuf],
    force: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let options = RestoreOptions {
        include: include.to_vec(),
        force,
        ..RestoreOptions::default()
    };
    let r = repo.restore_tree(name, target, &options)?;
    let seconds = start.elapsed().as_secs_f64();
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    for d in &r.damaged {
        for x in &d.ranges {
            eprintln!(
                "dedup: damaged: {}: bytes {}..{} not restored (left a hole): {}",
                d.path,
                x.offset,
                x.offset + x.len,
                x.error
            );
        }
    }
    let damaged = r.damaged.len();
    let report = Report {
        name: name.to_string(),
        target: target.display().to_string(),
        mb_per_sec: mb_per_sec(r.bytes, seconds),
        report: r,
        seconds,
    };
    let code = match damaged {
        0 => ExitCode::SUCCESS,
        n => {
            eprintln!(
                "dedup: {n} {} of backup {} could not be restored whole (named above; restored with holes where the damage is, and without their times); everything else was restored. `dedup store check {}` says what is damaged.",
                if n == 1 { "file" } else { "files" },
                name,
                location
            );
            ExitCode::from(1)
        }
    };
    if json {
        print_json(&report)?;
        return Ok(code);
    }
    let c = &report.report.counts;
    outln!(
        "Restored backup {} into {}: {} files ({}), {} directories, {} symlinks, {} hard links, {} special files; {:.1} s, {:.1} MB/s.",
        name,
        target.display(),
        c.files,
        format_size(report.report.bytes),
        c.dirs,
        c.symlinks,
        c.hard_links,
        c.specials,
        seconds,
        report.mb_per_sec
    );
    Ok(code)
}
