//! `dedup backup`: back a stream up into a repository (issue 17). Only
//! standard input for now; files and directories come later.

use std::io::{self, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::rpc::Endpoint;
use dedup_store::BackupReport;
use serde::Serialize;

use super::print_json;
use super::store::ReportJson;

#[derive(clap::Args)]
#[command(
    about = "Back up a stream from standard input into a repository (files and directories: not yet)",
    after_help = "Only --stdin works for now: backing up files and directories directly is not built yet, so pipe them in as a tar stream. The backup becomes visible only once all of it is durable; a backup that fails or is killed leaves no backup behind.\n\nExamples:\n  tar -cf - /home | dedup backup ./repo home-monday --stdin\n  pg_dump db | dedup backup ./repo db-1 --stdin --group db --json\n  tar -cf - /home | dedup backup --server unix:/run/dedup-backup.sock home-monday --stdin"
)]
pub struct Args {
    /// REPO NAME [PATH]: the repository directory (see `dedup store
    /// init`), the new backup's name (letters, digits, . _ -), and files or
    /// directories to back up (not supported yet: use --stdin). With
    /// --server, NAME [PATH].
    #[arg(value_name = "REPO NAME [PATH]", required = true, num_args = 1..=3)]
    pub args: Vec<String>,
    /// Back up through a running `dedup store serve` instead of opening
    /// the repository here: unix:PATH or tcp:HOST:PORT.
    #[arg(long, value_parser = Endpoint::parse)]
    pub server: Option<Endpoint>,
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

/// The positionals: (repository or server, name, path).
fn targets(a: &Args) -> anyhow::Result<(String, String, Option<PathBuf>)> {
    let (at, rest) = match &a.server {
        Some(s) => (s.to_string(), &a.args[..]),
        None => (a.args[0].clone(), &a.args[1..]),
    };
    match rest {
        [name] => Ok((at, name.clone(), None)),
        [name, path] => Ok((at, name.clone(), Some(path.into()))),
        [] if a.server.is_some() => {
            bail!("give the new backup's NAME: dedup backup --server {at} NAME --stdin")
        }
        [] => {
            bail!("give the repository and the new backup's name: dedup backup REPO NAME --stdin")
        }
        [_, _, extra, ..] => bail!("unexpected argument {extra:?}"),
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (at, name, path) = targets(&a)?;
    if let Some(p) = &path {
        bail!(
            "backing up files and directories ({}) is not built yet; pipe them in as a stream instead: tar -cf - {} | dedup backup {} {} --stdin",
            p.display(),
            p.display(),
            if a.server.is_some() { format!("--server {at}") } else { at.clone() },
            name
        );
    }
    if !a.stdin {
        bail!("nothing to back up: give --stdin and pipe the data in (files and directories are not supported yet)");
    }
    let stdin = io::stdin();
    if stdin.is_terminal() {
        bail!("--stdin is a terminal; pipe the data in, e.g. tar -cf - DIR | dedup backup {at} {name} --stdin");
    }
    if let Some(server) = &a.server {
        return super::backup_remote::run(server, &name, &a.group, a.json);
    }
    let repo_dir = PathBuf::from(&at);
    let repo = super::store::open_indexed(&repo_dir, &a.index)?;
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
    let result = repo.backup_stream(
        &name,
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
        name: name.clone(),
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
        name,
        repo_dir.display(),
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
