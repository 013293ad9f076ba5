//! `dedup backup --server`: back a stream, or files and directories, up
//! through `dedup store serve` with the pipelined client (cut and hashed
//! here, only new segments sent; a walk's tree goes with the commit).

use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::rpc::{BackupOptions, Client, Endpoint, Key};
use dedup_store::{TreeWalk, WalkCounts};
use serde::Serialize;

use super::backup::mb_per_sec;
use super::backup_files::{counts_text, reused_text, skipped_text};
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
    /// What a backup of files reused from its parent without reading.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    parent: Option<ParentJson>,
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

/// A spinner counting the stream bytes the server has taken, sent or
/// reused from the parent (hidden for --json or when stderr is not a
/// terminal).
fn spinner(name: &str, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template(
        "{spinner} backing up {msg} through the server: {bytes} taken, {bytes_per_sec}, {elapsed}",
    )?);
    bar.set_message(name.to_string());
    if json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Ok(bar)
}

/// Where a client command reaches its server, and how.
pub struct Remote<'a> {
    pub server: &'a Endpoint,
    /// Give up after this many seconds without an answer (`--timeout`;
    /// 0: never).
    pub timeout: u64,
    /// The key file (`--psk`) whose key this client and the server prove
    /// to each other they hold.
    pub psk: Option<&'a Path>,
    /// `--no-auth`: connect over TCP without a key.
    pub no_auth: bool,
}

/// Fewest bytes of a key file's secret: less is guessable.
const MIN_SECRET: usize = 16;

/// The key of a PSK file (`--psk`), for a server or a client.
pub fn key_from_file(path: &Path) -> anyhow::Result<Key> {
    let secret = super::tls::psk_secret(path)?;
    if secret.len() < MIN_SECRET {
        bail!(
            "the key in {} is {} bytes, too short to keep others out (at least {MIN_SECRET}): make one with `dedup tls-psk FILE`",
            path.display(),
            secret.len()
        );
    }
    super::tls::warn_if_shared(path);
    Ok(Key::derive(&secret))
}

impl Remote<'_> {
    pub fn connect(&self) -> anyhow::Result<Client> {
        // Any local user can listen on a TCP port: without the key, the
        // client cannot tell the server from another process on it.
        if matches!(self.server, Endpoint::Tcp(_)) && self.psk.is_none() && !self.no_auth {
            bail!(
                "{} is TCP: give --psk FILE (a copy of the server's key file), so that the client checks it reaches the server and not another process on the port; --no-auth connects without one, to a server started with --no-auth",
                self.server
            );
        }
        let key = self.psk.map(key_from_file).transpose()?;
        let timeout = Some(Duration::from_secs(self.timeout));
        Ok(Client::connect_with_key(
            self.server,
            timeout,
            key.as_ref(),
        )?)
    }
}

/// Standard input as a stream.
pub fn run(remote: &Remote<'_>, name: &str, group: &str, json: bool) -> anyhow::Result<ExitCode> {
    let client = remote.connect()?;
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
    report(remote.server, b?, None, start, json)
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
    let bar = spinner(name, json)?;
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
    report(remote.server, b.backup, Some(files), start, json)
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
    if let Some(ParentJson {
        parent: Some(p),
        files_unchanged,
        bytes_unchanged,
        ..
    }) = &report.parent
    {
        println!("{}", reused_text(p, *files_unchanged, *bytes_unchanged));
    }
    Ok(ExitCode::SUCCESS)
}
