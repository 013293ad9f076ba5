//! `dedup list`: the committed backups in a repository.

use std::io::Write;
use std::process::ExitCode;

use dedup_store::RepoLocation;

use dedup_core::size::format_size;
use serde::Serialize;

use super::shared::repo::open_read_only;
use super::shared::report::{print_json, utc, ReportJson};

#[derive(clap::Args)]
#[command(
    about = "List the backups in a repository",
    after_help = "Only committed backups are listed: one that failed or was killed part-way never appears. A backup whose backup object is damaged is named on stderr (the others are still listed) and the exit status is 1.\n\nExamples:\n  dedup list ./repo\n  dedup list ./repo --json"
)]
pub struct Args {
    /// Repository directory.
    pub repo: RepoLocation,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Entry {
    name: String,
    group: String,
    /// `files` (a backup of files and directories) or `stream`.
    kind: &'static str,
    /// Seconds since the Unix epoch when the backup committed.
    time: u64,
    #[serde(flatten)]
    report: ReportJson,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let repo = open_read_only(&a.repo)?;
    let listing = repo.list_backups_all()?;
    let status = damaged(&a.repo, &listing.damaged);
    let entries: Vec<Entry> = listing
        .backups
        .into_iter()
        .map(|b| Entry {
            name: b.name,
            group: b.group,
            kind: if b.tree.is_some() { "files" } else { "stream" },
            time: b.time,
            report: b.report.into(),
        })
        .collect();
    if a.json {
        print_json(&entries)?;
        return Ok(status);
    }
    if entries.is_empty() && status == ExitCode::SUCCESS {
        outln!("{}: no backups yet.", a.repo);
        return Ok(status);
    }
    // A table can be long and is often piped into `head` or `grep -q`:
    // a reader that stops early ends the listing, not in a panic.
    let mut out = std::io::stdout().lock();
    let mut table = || -> std::io::Result<()> {
        writeln!(
            out,
            "{:<24} {:<12} {:<6} {:<23} {:>11} {:>11} {:>8}",
            "NAME", "GROUP", "KIND", "TIME", "SIZE", "NEW", "RATIO"
        )?;
        for e in &entries {
            writeln!(
                out,
                "{:<24} {:<12} {:<6} {:<23} {:>11} {:>11} {:>8}",
                e.name,
                e.group,
                e.kind,
                utc(e.time),
                format_size(e.report.counts.bytes_in),
                format_size(e.report.counts.bytes_new),
                e.report
                    .dedup_ratio
                    .map(|r| format!("{r:.2}"))
                    .unwrap_or_else(|| "all dup".into())
            )?;
        }
        out.flush()
    };
    match table() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(status),
        other => {
            other?;
            Ok(status)
        }
    }
}

/// Name each damaged backup on stderr, with what to do; exit status 1 if
/// there is one.
fn damaged(repo: &RepoLocation, damaged: &[dedup_store::DamagedBackup]) -> ExitCode {
    for d in damaged {
        eprintln!(
            "dedup list: backup {} cannot be listed: {}. `dedup store check {}` says what else it costs; `dedup delete {} {}` removes it (until then gc keeps what it may reference).",
            d.name,
            d.detail,
            repo,
            repo,
            d.name
        );
    }
    if damaged.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
