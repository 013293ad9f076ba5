//! `dedup backup REPO NAME PATH...`: back files and directories up with
//! their metadata (the store's `Repository::backup_paths`), with a
//! progress bar by bytes read and a report of what was stored.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use dedup_core::size::format_size;
use dedup_store::{RepoLocation, TreeBackupReport, WalkCounts};
use serde::Serialize;

use super::shared::args::IndexArgs;
use super::shared::progress::backup_spinner;
use super::shared::repo::open_indexed;
use super::shared::report::{
    counts_text, mb_per_sec, print_json, ratio_text, reused_text, skipped_text, IndexJson,
    ReportJson,
};

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    #[serde(flatten)]
    report: ReportJson,
    #[serde(flatten)]
    counts: WalkCounts,
    #[serde(flatten)]
    index: Option<IndexJson>,
    warnings: Vec<String>,
    /// The backup whose unchanged files were reused without reading them.
    parent: Option<String>,
    files_unchanged: u64,
    bytes_unchanged: u64,
    seconds: f64,
    mb_per_sec: f64,
}

/// Back `paths` up into the repository at `location` as backup `name` of
/// `group` (`dedup backup`'s arguments, taken apart by `backup.rs`).
pub fn run(
    location: &RepoLocation,
    index: &IndexArgs,
    name: &str,
    group: &str,
    paths: &[PathBuf],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let repo = open_indexed(location, index)?;
    let bar = backup_spinner(name, json)?;
    let start = Instant::now();
    let result = repo.backup_paths(name, group, paths, |n| bar.inc(n));
    bar.finish_and_clear();
    let TreeBackupReport {
        backup: r,
        counts: c,
        warnings,
        parent,
        files_unchanged,
        bytes_unchanged,
    } = result?;
    let seconds = start.elapsed().as_secs_f64();
    // Skipped entries are worth saying even with --json: stderr.
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let report = Report {
        name: name.to_string(),
        group: group.to_string(),
        report: r.into(),
        counts: c,
        index: IndexJson::of(&repo),
        warnings,
        parent,
        files_unchanged,
        bytes_unchanged,
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "Backed up {} into {} (group {}): {}{} in, {} new ({} written), dedup ratio {}; {:.1} s, {:.1} MB/s{}.",
        name,
        location,
        group,
        counts_text(&c),
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        ratio_text(&r),
        seconds,
        report.mb_per_sec,
        skipped_text(report.warnings.len())
    );
    if let Some(p) = &report.parent {
        outln!(
            "{}",
            reused_text(p, report.files_unchanged, report.bytes_unchanged)
        );
    }
    if let Some(i) = report.index {
        i.print();
    }
    Ok(ExitCode::SUCCESS)
}
