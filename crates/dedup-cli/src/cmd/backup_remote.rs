//! `dedup backup --server`: back a stream, files and directories, or a
//! dedup device up through `dedup store serve`: a stream or files with
//! the pipelined client (cut and hashed here, only new segments sent; a
//! walk's tree goes with the commit), a device by its fingerprints.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use dedup_core::size::format_size;
use dedup_store::backup_blocks::BlocksReport;
use dedup_store::rpc::{BackupOptions, Endpoint};
use dedup_store::{TreeWalk, WalkCounts};
use serde::Serialize;

use super::shared::progress::{blocks_bar, server_backup_spinner};
use super::shared::repo::Remote;
use super::shared::report::{
    counts_text, mb_per_sec, print_json, reused_text, skipped_text, ReportJson,
};
use super::shared::served_blocks::served_or_stopped;

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    server: String,
    #[serde(flatten)]
    report: ReportJson,
    /// What a backup of files held.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    counts: Option<WalkCounts>,
    /// Entries a backup of files skipped, one line each.
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<Vec<String>>,
    /// What a backup of files reused from its parent without reading.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    parent: Option<ParentJson>,
    /// What a backup of a device read, and why not by fingerprint.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    blocks: Option<BlocksReport>,
    /// Whether that device was served (read through a snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    served: Option<bool>,
    seconds: f64,
    mb_per_sec: f64,
}

/// A backup of files' parent: the one whose unchanged files were not
/// read (`parent` null if there was none).
#[derive(Serialize)]
struct ParentJson {
    parent: Option<String>,
    files_unchanged: u64,
    bytes_unchanged: u64,
    /// Why the parent could not be reused, when a first try with it
    /// failed and every file was read instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_refused: Option<String>,
}

/// Standard input as a stream.
pub fn run(remote: &Remote<'_>, name: &str, group: &str, json: bool) -> anyhow::Result<ExitCode> {
    let client = remote.connect()?;
    let bar = server_backup_spinner(name, json)?;
    let start = Instant::now();
    let b = client.backup_stream(
        name,
        group,
        io::BufReader::with_capacity(1 << 20, io::stdin()),
        None,
        &BackupOptions::default(),
        &|n| bar.set_position(n),
    );
    bar.finish_and_clear();
    report(remote.server, b?, None, None, start, json)
}

/// A dedup device (served: through a snapshot of one instant), by its
/// fingerprints where the repository's segments can be its chunks: only
/// the chunks the server lacks are read and sent. Else its image is read
/// whole and sent as a stream, and the report says why.
pub fn run_device(
    remote: &Remote<'_>,
    name: &str,
    group: &str,
    dir: &Path,
    walk_all: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let client = remote.connect()?;
    let (source, served) = served_or_stopped(dir, walk_all)?;
    let bar = blocks_bar(name, source.blocks(), json)?;
    let start = Instant::now();
    let b = client.backup_blocks(name, group, source.as_ref(), &|n| bar.set_position(n));
    bar.finish_and_clear();
    // Ended only now: a served device's snapshot held what it read.
    drop(source);
    let (b, blocks) = b?;
    let device = Device { blocks, served };
    report(remote.server, b, None, Some(device), start, json)
}

/// Files and directories, with their metadata.
pub fn run_files(
    remote: &Remote<'_>,
    name: &str,
    group: &str,
    paths: &[PathBuf],
    json: bool,
) -> anyhow::Result<ExitCode> {
    // Paths that are not there fail before anything is sent.
    TreeWalk::new(paths)?;
    let client = remote.connect()?;
    let bar = server_backup_spinner(name, json)?;
    let start = Instant::now();
    let result = client.backup_paths(name, group, paths, &BackupOptions::default(), &|n| {
        bar.set_position(n)
    });
    bar.finish_and_clear();
    let b = result?;
    // Skipped entries are worth saying even with --json: stderr.
    for w in &b.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(why) = &b.parent_refused {
        eprintln!("warning: the parent backup could not be reused, so every file was read: {why}");
    }
    let files = Files {
        counts: b.counts,
        warnings: b.warnings,
        parent: ParentJson {
            parent: b.parent,
            files_unchanged: b.files_unchanged,
            bytes_unchanged: b.bytes_unchanged,
            parent_refused: b.parent_refused,
        },
    };
    report(remote.server, b.backup, Some(files), None, start, json)
}

/// What a backup of a device adds to its report.
struct Device {
    blocks: BlocksReport,
    served: bool,
}

/// What a backup of files adds to its report.
struct Files {
    counts: WalkCounts,
    warnings: Vec<String>,
    parent: ParentJson,
}

fn report(
    server: &Endpoint,
    b: dedup_store::rpc::WireBackup,
    files: Option<Files>,
    device: Option<Device>,
    start: Instant,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let r = b.report;
    let seconds = start.elapsed().as_secs_f64();
    let (counts, warnings, parent) = match files {
        Some(f) => (Some(f.counts), Some(f.warnings), Some(f.parent)),
        None => (None, None, None),
    };
    let report = Report {
        name: b.name,
        group: b.group,
        server: server.to_string(),
        report: r.into(),
        counts,
        warnings,
        parent,
        served: device.as_ref().map(|d| d.served),
        blocks: device.map(|d| d.blocks),
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    // Worth saying even with --json: stderr.
    if let Some(why) = report
        .blocks
        .as_ref()
        .and_then(|b| b.parent_refused.as_ref())
    {
        eprintln!(
            "warning: the parent backup could not be taken from, so every block was walked: {why}"
        );
    }
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let files = report.counts.as_ref().map_or(String::new(), counts_text);
    outln!(
        "Backed up {} through {} (group {}): {files}{} in, {} new ({} written), {} segments new, {} duplicate; {:.1} s, {:.1} MB/s{}.",
        report.name,
        server,
        report.group,
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        r.segments_new,
        r.segments_duplicate,
        seconds,
        report.mb_per_sec,
        skipped_text(report.warnings.as_ref().map_or(0, Vec::len))
    );
    if let Some(b) = report.blocks.as_ref() {
        outln!("The device was backed up {}.", b.how());
    }
    if let Some(ParentJson {
        parent: Some(p),
        files_unchanged,
        bytes_unchanged,
        ..
    }) = &report.parent
    {
        outln!("{}", reused_text(p, *files_unchanged, *bytes_unchanged));
    }
    Ok(ExitCode::SUCCESS)
}
