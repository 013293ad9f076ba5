//! `dedup backup REPO NAME PATH...`: back files and directories up with
//! their metadata (the store's `Repository::backup_paths`), with a
//! progress bar by bytes read and a report of what was stored.

use std::io::{self, IsTerminal};
use std::process::ExitCode;
use std::time::Instant;

use dedup_core::size::format_size;
use dedup_store::{TreeBackupReport, WalkCounts};
use serde::Serialize;

use super::backup::{mb_per_sec, Args};
use super::print_json;
use super::store::ReportJson;

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    #[serde(flatten)]
    report: ReportJson,
    #[serde(flatten)]
    counts: WalkCounts,
    #[serde(flatten)]
    index: Option<super::store::IndexJson>,
    warnings: Vec<String>,
    /// The backup whose unchanged files were reused without reading them.
    parent: Option<String>,
    files_unchanged: u64,
    bytes_unchanged: u64,
    seconds: f64,
    mb_per_sec: f64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Present: clap requires it unless --server, which never comes here.
    let name = a.name.clone().unwrap_or_default();
    let repo = super::store::open_indexed(&a.repo, &a.index)?;
    let bar =
        indicatif::ProgressBar::new_spinner().with_style(indicatif::ProgressStyle::with_template(
            "{spinner} backing up {msg}: {bytes} read, {bytes_per_sec}, {elapsed}",
        )?);
    bar.set_message(name.clone());
    if a.json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let start = Instant::now();
    let result = repo.backup_paths(&name, &a.group, &a.paths, |n| bar.inc(n));
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
        name: name.clone(),
        group: a.group.clone(),
        report: r.into(),
        counts: c,
        index: super::store::IndexJson::of(&repo),
        warnings,
        parent,
        files_unchanged,
        bytes_unchanged,
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if a.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Backed up {} into {} (group {}): {}{} in, {} new ({} written), dedup ratio {}; {:.1} s, {:.1} MB/s{}.",
        name,
        a.repo.display(),
        a.group,
        counts_text(&c),
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        super::store::ratio_text(&r),
        seconds,
        report.mb_per_sec,
        skipped_text(report.warnings.len())
    );
    if let Some(p) = &report.parent {
        println!(
            "{}",
            reused_text(p, report.files_unchanged, report.bytes_unchanged)
        );
    }
    if let Some(i) = report.index {
        i.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// What a backup of files held, for its one-line report.
/// What the walk found, as the report's first line: the sizes follow on
/// a line of their own, so a terminal never wraps the report mid-phrase.
pub(super) fn counts_text(c: &WalkCounts) -> String {
    format!(
        "{} files, {} directories, {} symlinks, {} hard links, {} special files.\n",
        c.files, c.dirs, c.symlinks, c.hard_links, c.specials
    )
}

/// The end of the one-line report when `n` entries were skipped.
/// The line about what a backup of files reused from its parent.
pub(super) fn reused_text(parent: &str, files: u64, bytes: u64) -> String {
    format!(
        "{files} unchanged files reused from backup {parent}: {} not read.",
        format_size(bytes)
    )
}

pub(super) fn skipped_text(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!("; {n} skipped (see the warnings above)"),
    }
}
