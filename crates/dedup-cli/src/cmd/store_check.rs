//! `dedup store check`: verify a backup repository without writing to it
//! (dedup_store::check does the checking; this opens, shows progress and
//! renders). Exit 0 clean, 1 damage found, 2 could not run.

use std::io::{self, IsTerminal};
use std::process::ExitCode;

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::check::{check, CheckOptions, CheckPhase, CheckProgress, CheckReport};
use dedup_store::config::CONFIG_OBJECT;
use dedup_store::{Error, ObjectStore, RepoLocation};
use serde::Serialize;

use super::shared::report::print_json;

#[derive(clap::Args)]
#[command(
    about = "Check a backup repository's objects; writes nothing (exit 0 clean, 1 damage found, 2 could not run)",
    after_help = "Without --data: the config, every backup object and the recipe and tree it names, every container's header, catalog and trailer, and that every recipe reference finds its catalog entry (same fingerprint and length). With --data, also every segment: each container is read whole once and every segment's crc32c, and BLAKE3 after decompressing, is verified.\n\nEach problem names the damaged object and the backups that cannot be fully restored because of it. Recipes, trees and containers no backup needs (left by backups that did not finish, or by deleted ones) are listed as garbage, which is not damage.\n\nExamples:\n  dedup store check ./repo\n  dedup store check ./repo --data\n  dedup store check ./repo --data --json"
)]
pub struct CheckArgs {
    /// Repository: a directory or s3://BUCKET/PREFIX.
    pub repo: RepoLocation,
    /// Also read every segment and verify it against its catalog entry.
    #[arg(long)]
    pub data: bool,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Json<'a> {
    repository: String,
    #[serde(flatten)]
    report: &'a CheckReport,
    /// Every backup some problem affects.
    affected_backups: Vec<&'a str>,
}

pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let store = open(&a.repo)?;
    let bar = progress_bar(a.data)?;
    if a.json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = check(
        &*store,
        CheckOptions { data: a.data },
        &|p: CheckProgress| {
            bar.set_message(phase_label(p.phase, a.data));
            bar.set_length(p.total);
            bar.set_position(p.done);
        },
    );
    bar.finish_and_clear();
    let report = report?;
    if a.json {
        print_json(&Json {
            repository: a.repo.to_string(),
            report: &report,
            affected_backups: report.affected_backups().into_iter().collect(),
        })?;
    } else {
        out!("{}", render(&a.repo, &report));
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The repository's object store, refusing (exit 2) what is not one.
/// Checked by hand rather than with `Repository::open`, which would create
/// a missing directory and reads every catalog before the check could.
fn open(repo: &RepoLocation) -> anyhow::Result<std::sync::Arc<dyn ObjectStore>> {
    if let Some(dir) = repo.dir().filter(|dir| !dir.is_dir()) {
        bail!("{}: no such directory", dir.display());
    }
    let store = dedup_store::repo::open_objects(repo)?;
    if let Err(Error::NotFound { .. }) = store.get(CONFIG_OBJECT) {
        bail!("{repo}: not a dedup repository: it has no {CONFIG_OBJECT} object");
    }
    Ok(store)
}

fn progress_bar(data: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(phase_label(CheckPhase::Backups, data));
    Ok(bar)
}

fn phase_label(phase: CheckPhase, data: bool) -> &'static str {
    match (phase, data) {
        (CheckPhase::Backups, _) => "checking backups",
        (CheckPhase::Trees, _) => "checking trees",
        (CheckPhase::Recipes, _) => "checking recipes",
        (CheckPhase::Containers, false) => "checking catalogs",
        (CheckPhase::Containers, true) => "verifying containers",
    }
}

fn render(repo: &RepoLocation, r: &CheckReport) -> String {
    let c = &r.counts;
    let mut out = format!(
        "Checked {} ({}): {}, {}{}, {}, {}, {} stored.\n",
        repo,
        if r.data_verified {
            "every segment verified"
        } else {
            "catalogs and references; segment data not read, use --data"
        },
        count(c.backups as usize, "backup"),
        count(c.recipes as usize, "recipe"),
        match c.trees {
            0 => String::new(),
            n => format!(", {}", count(n as usize, "tree")),
        },
        count(c.containers as usize, "container"),
        count(c.segments as usize, "segment"),
        format_size(c.bytes_stored)
    );
    if !r.problems.is_empty() {
        out += &format!("\n{}:\n", count(r.problems.len(), "problem"));
        for p in &r.problems {
            out += &format!("  {p}\n");
            if !p.affected_backups.is_empty() {
                let names: Vec<&str> = p.affected_backups.iter().map(String::as_str).collect();
                out += &format!("    cannot be fully restored: {}\n", names.join(", "));
            }
        }
    }
    if !r.garbage.is_empty() {
        out += &format!(
            "\n{} of garbage (not damage; no committed backup needs them):\n",
            count(r.garbage.len(), "object")
        );
        for g in &r.garbage {
            out += &format!("  {g}\n");
        }
        if !r.garbage_complete {
            out += "  Some of it may be what a damaged backup needed: do not remove it until the damage is understood.\n";
        }
    }
    let affected: Vec<&str> = r.affected_backups().into_iter().collect();
    out += &if r.is_clean() {
        "\nNo damage found.\n".to_string()
    } else if affected.is_empty() {
        format!(
            "\n{} found; every backup can still be restored.\n",
            count(r.problems.len(), "problem")
        )
    } else {
        format!(
            "\n{} found; backups that cannot be fully restored: {}\n",
            count(r.problems.len(), "problem"),
            affected.join(", ")
        )
    };
    out
}

/// "1 problem", "2 problems".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
