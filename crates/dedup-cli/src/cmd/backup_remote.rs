//! `dedup backup --server`: back a stream, or files and directories, up
//! through `dedup store serve` with the pipelined client (cut and hashed
//! here, only new segments sent; a walk's tree goes with the commit).

use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use dedup_core::size::format_size;
use dedup_store::rpc::{BackupOptions, Client, ClientError, Endpoint};
use dedup_store::{TreeWalk, WalkCounts};
use serde::Serialize;

use super::backup::mb_per_sec;
use super::backup_files::{counts_text, skipped_text};
use super::print_json;
use super::store::ReportJson;

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
    seconds: f64,
    mb_per_sec: f64,
}

/// A spinner counting the bytes the server has taken (hidden for --json
/// or when stderr is not a terminal).
fn spinner(name: &str, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template(
        "{spinner} backing up {msg} through the server: {bytes} sent, {bytes_per_sec}, {elapsed}",
    )?);
    bar.set_message(name.to_string());
    if json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Ok(bar)
}

/// A client of `server` that gives up after `timeout` seconds without an
/// answer (`--timeout`; 0: never).
pub fn connect(server: &Endpoint, timeout: u64) -> Result<Client, ClientError> {
    Client::connect_with(server, Some(Duration::from_secs(timeout)))
}

/// Standard input as a stream.
pub fn run(
    server: &Endpoint,
    timeout: u64,
    name: &str,
    group: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let client = connect(server, timeout)?;
    let bar = spinner(name, json)?;
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
    report(server, b?, None, None, start, json)
}

/// Files and directories, with their metadata.
pub fn run_files(
    server: &Endpoint,
    timeout: u64,
    name: &str,
    group: &str,
    paths: &[PathBuf],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let walk = TreeWalk::new(paths)?;
    let client = connect(server, timeout)?;
    let bar = spinner(name, json)?;
    let start = Instant::now();
    let result = client.backup_files(name, group, walk, &BackupOptions::default(), &|n| {
        bar.set_position(n)
    });
    bar.finish_and_clear();
    let (b, counts, warnings) = result?;
    // Skipped entries are worth saying even with --json: stderr.
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    report(server, b, Some(counts), Some(warnings), start, json)
}

fn report(
    server: &Endpoint,
    b: dedup_store::rpc::WireBackup,
    counts: Option<WalkCounts>,
    warnings: Option<Vec<String>>,
    start: Instant,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let r = b.report;
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        name: b.name,
        group: b.group,
        server: server.to_string(),
        report: r.into(),
        counts,
        warnings,
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let files = report.counts.as_ref().map_or(String::new(), counts_text);
    println!(
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
    Ok(ExitCode::SUCCESS)
}
