//! `dedup backup`: back a stream up into a repository (issue 17). Only
//! standard input for now; files and directories come later.

use std::io::{self, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::BackupReport;
use serde::Serialize;

use super::print_json;
use super::store::ReportJson;

#[derive(clap::Args)]
#[command(
    about = "Back up a stream from standard input into a repository (files and directories: not yet)",
    after_help = "Only --stdin works for now: backing up files and directories directly is not built yet, so pipe them in as a tar stream. The backup becomes visible only once all of it is durable; a backup that fails or is killed leaves no backup behind.\n\nExamples:\n  tar -cf - /home | dedup backup ./repo home-monday --stdin\n  pg_dump db | dedup backup ./repo db-1 --stdin --group db --json"
)]
pub struct Args {
    /// Repository directory (see `dedup store init`).
    pub repo: PathBuf,
    /// Name of the new backup (letters, digits, . _ -).
    pub name: String,
    /// Files or directories to back up: not supported yet (use --stdin).
    pub path: Option<PathBuf>,
    /// Back up standard input.
    #[arg(long)]
    pub stdin: bool,
    /// Backup group the backup belongs to.
    #[arg(long, default_value = "default")]
    pub group: String,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub index: super::store::IndexArgs,
}

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    #[serde(flatten)]
    report: ReportJson,
    #[serde(flatten)]
    index: Option<super::store::IndexJson>,
    seconds: f64,
    mb_per_sec: f64,
}

/// Counts the bytes read into the progress bar.
struct Counting<R> {
    inner: R,
    bar: indicatif::ProgressBar,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(p) = &a.path {
        bail!(
            "backing up files and directories ({}) is not built yet; pipe them in as a stream instead: tar -cf - {} | dedup backup {} {} --stdin",
            p.display(),
            p.display(),
            a.repo.display(),
            a.name
        );
    }
    if !a.stdin {
        bail!("nothing to back up: give --stdin and pipe the data in (files and directories are not supported yet)");
    }
    let stdin = io::stdin();
    if stdin.is_terminal() {
        bail!("--stdin is a terminal; pipe the data in, e.g. tar -cf - DIR | dedup backup {} {} --stdin", a.repo.display(), a.name);
    }
    let repo = super::store::open_indexed(&a.repo, &a.index)?;
    let bar =
        indicatif::ProgressBar::new_spinner().with_style(indicatif::ProgressStyle::with_template(
            "{spinner} backing up {msg}: {bytes} read, {bytes_per_sec}, {elapsed}",
        )?);
    bar.set_message(a.name.clone());
    if a.json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let start = Instant::now();
    let result = repo.backup_stream(
        &a.name,
        &a.group,
        Counting {
            inner: stdin,
            bar: bar.clone(),
        },
    );
    bar.finish_and_clear();
    let r: BackupReport = result?;
    let seconds = start.elapsed().as_secs_f64();
    let ratio = r.dedup_ratio();
    let report = Report {
        name: a.name.clone(),
        group: a.group.clone(),
        report: r.into(),
        index: super::store::IndexJson::of(&repo),
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if a.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Backed up {} into {} (group {}): {} in, {} new ({} written, {} new containers), dedup ratio {}; {} segments new, {} duplicate; {:.1} s, {:.1} MB/s.",
        a.name,
        a.repo.display(),
        a.group,
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        r.containers_written,
        if ratio.is_finite() {
            format!("{ratio:.2}")
        } else {
            "infinite (nothing new)".into()
        },
        r.segments_new,
        r.segments_duplicate,
        seconds,
        report.mb_per_sec
    );
    if let Some(i) = report.index {
        println!(
            "Index: {} of RAM for {} segments{}, and a {} prefetch cache.",
            format_size(i.index_ram_bytes),
            i.index_fingerprints,
            i.index_ram_per_tib
                .map(|b| format!(" ({} per TiB stored)", format_size(b as u64)))
                .unwrap_or_default(),
            format_size(i.index_cache_bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Decimal megabytes per second (0 for an instant).
pub fn mb_per_sec(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e6 / seconds
    } else {
        0.0
    }
}
