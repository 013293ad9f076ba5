//! `dedup store remote`: list, restore, delete, stats and gc through a running
//! `dedup store serve`, for clients that do not have the directory.

use std::fs;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use dedup_core::size::format_size;
use dedup_store::rpc::{Client, Endpoint};
use serde::Serialize;

use super::shared::args::percent_not_fraction;
use super::shared::repo::Remote;
use super::shared::report::{damaged_note, name_damage, print_json, utc, ReportJson};

#[derive(clap::Args)]
#[command(
    about = "List, restore, delete, sum up and collect garbage through a running dedup store serve",
    after_help = "Examples:\n  dedup store remote --server unix:/run/dedup-backup.sock list\n  dedup store remote --server tcp:127.0.0.1:7070 --psk backup.psk restore home-monday home.tar\n  dedup store remote --server tcp:127.0.0.1:7070 --psk backup.psk delete home-monday\n  dedup store remote --server unix:/run/dedup-backup.sock stats --json"
)]
pub struct Args {
    /// The server: unix:PATH or tcp:HOST:PORT.
    #[arg(long, value_parser = Endpoint::parse)]
    pub server: Endpoint,
    /// Give up when the server has answered nothing, or taken no data,
    /// for this many seconds (0: wait for ever).
    #[arg(long, value_name = "SECS", default_value_t = 3600, global = true)]
    pub timeout: u64,
    /// A copy of the key file the server was started with (`dedup store
    /// serve --psk FILE`): the client proves it holds the key and checks
    /// that the server does, before anything else.
    #[arg(long, value_name = "FILE", global = true)]
    pub psk: Option<PathBuf>,
    /// With a tcp: --server: connect without a key (to a server started
    /// with --no-auth), unable to check it is the server you meant.
    #[arg(long, global = true, conflicts_with = "psk")]
    pub no_auth: bool,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: RemoteCommand,
}

#[derive(clap::Subcommand)]
pub enum RemoteCommand {
    /// List the backups.
    List,
    /// Delete a backup (its containers stay until a garbage collection).
    Delete { name: String },
    /// What the repository holds, and what the server is doing.
    Stats,
    /// Collect garbage in the server's repository, beside running backups.
    Gc {
        /// Compact a container whose live share of stored bytes is below
        /// PERCENT (0 never compacts), as `dedup gc --compact-below`; the
        /// server's default (50) if not given.
        #[arg(long, value_name = "PERCENT", value_parser = percent_not_fraction)]
        compact_below: Option<f64>,
    },
    /// Restore a backup of a stream through the server to a new file, or
    /// `-` (stdout); with --force over a file (a new one written beside it
    /// and renamed into place, so a failed restore leaves it as it was; it
    /// needs room for both, and other hard links, extended attributes and
    /// ACLs of the old one are not carried over) or onto a device (written
    /// in place; a block device that is mounted, or smaller than the
    /// backup, is refused untouched; a fifo once something reads it).
    /// Past damage in the server's repository it goes on as `dedup
    /// restore` does: what is intact is written, each damaged range as
    /// zeros, named on stderr (and in --json, as "damaged"), exit status 1.
    Restore {
        name: String,
        target: PathBuf,
        /// Replace TARGET if it exists, or write onto a device.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Serialize)]
struct Listed {
    name: String,
    group: String,
    time: u64,
    has_tree: bool,
    #[serde(flatten)]
    report: ReportJson,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let c = Remote {
        server: &a.server,
        timeout: a.timeout,
        psk: a.psk.as_deref(),
        no_auth: a.no_auth,
    }
    .connect()?;
    let mut status = ExitCode::SUCCESS;
    match a.command {
        RemoteCommand::List => {
            let (backups, damaged) = c.list_all()?;
            for d in &damaged {
                eprintln!(
                    "dedup store remote list: backup {} cannot be listed: {}. `dedup store remote delete {}` removes it.",
                    d.name, d.detail, d.name
                );
            }
            if !damaged.is_empty() {
                status = ExitCode::from(1);
            }
            if a.json {
                let v: Vec<Listed> = backups
                    .into_iter()
                    .map(|b| Listed {
                        name: b.name,
                        group: b.group,
                        time: b.time,
                        has_tree: b.has_tree,
                        report: b.report.into(),
                    })
                    .collect();
                print_json(&v)?;
            } else {
                for b in backups {
                    outln!(
                        "{} {} {} {}",
                        b.name,
                        b.group,
                        utc(b.time),
                        format_size(b.report.bytes_in)
                    );
                }
            }
        }
        RemoteCommand::Delete { name } => {
            c.delete(&name)?;
            if a.json {
                print_json(&serde_json::json!({ "deleted": name }))?;
            } else {
                outln!("Deleted backup {name} (its containers stay until a garbage collection).");
            }
        }
        RemoteCommand::Stats => {
            let s = c.stats()?;
            if a.json {
                print_json(&serde_json::json!({
                    "backups": s.backups,
                    "containers": s.containers,
                    "logical_bytes": s.logical_bytes,
                    "damaged_containers": s.damaged_containers,
                    "running_backups": s.running_backups,
                    "connections": s.connections,
                }))?;
            } else {
                outln!(
                    "{}: {} backups, {} logical in {} containers; {} backups running, {} connections.",
                    a.server,
                    s.backups,
                    format_size(s.logical_bytes),
                    s.containers,
                    s.running_backups,
                    s.connections
                );
            }
        }
        RemoteCommand::Gc { compact_below } => {
            let r = c.gc(compact_below.map(|p| p / 100.0))?;
            if a.json {
                print_json(&serde_json::json!({
                    "backups": r.backups,
                    "containers": r.containers,
                    "containers_protected": r.containers_protected,
                    "containers_swept": r.containers_swept,
                    "containers_compacted": r.containers_compacted,
                    "bytes_reclaimed": r.bytes_reclaimed,
                    "orphans_removed": r.orphans_removed,
                    "backups_damaged": r.backups_damaged,
                    "orphans_kept": r.orphans_kept,
                    "sweep_withheld": r.sweep_withheld,
                    "seconds": r.seconds,
                }))?;
            } else {
                outln!(
                    "Collected: {} of {} containers deleted, {} compacted, {} kept for running backups; {} reclaimed ({:.1} s).",
                    r.containers_swept,
                    r.containers,
                    r.containers_compacted,
                    r.containers_protected,
                    format_size(r.bytes_reclaimed),
                    r.seconds
                );
                if let Some(note) = damaged_note(&r) {
                    outln!("{note}");
                }
            }
        }
        RemoteCommand::Restore {
            name,
            target,
            force,
        } => status = restore(&c, &name, &target, force, a.json)?,
    }
    Ok(status)
}

/// Like `dedup restore` (`restore_target.rs`): a file TARGET must be new
/// unless `force`, and a failed restore leaves it as it was; a device is
/// written in place (a block device only if it can hold the backup). Past
/// damage too: the server sends what is intact and names each damaged
/// range, written here as zeros; the exit status is then 1.
fn restore(
    c: &Client,
    name: &str,
    target: &Path,
    force: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The server's repository is not here to check: say where it is.
    let check = "`dedup store check` of the server's repository";
    if target.as_os_str() == "-" {
        if json {
            anyhow::bail!("--json and `-` would both write to standard output: give a file");
        }
        let mut out = BufWriter::with_capacity(1 << 20, io::stdout().lock());
        let s = c.restore(name, &mut out)?;
        out.flush().context("writing to standard output")?;
        eprintln!(
            "Restored {} of backup {name} to standard output.",
            format_size(s.bytes)
        );
        return Ok(name_damage(name, &s.damaged, check));
    }
    // A block device is checked against the backup's length before it is
    // written; the server's list tells it. (Only then: a damaged record of
    // another backup fails the whole list, and a file needs no length.)
    let is_block = fs::metadata(target).is_ok_and(|m| m.file_type().is_block_device());
    let need = match is_block {
        true => match c.list()?.into_iter().find(|b| b.name == name) {
            Some(b) => Some(b.report.bytes_in),
            None => anyhow::bail!(
                "the server has no backup named {name} (see `dedup store remote list`)"
            ),
        },
        false => None,
    };
    let mut damaged = Vec::new();
    // The server sends the stream in order: nothing to gain at offsets.
    let n = super::restore_target::restore_to(
        target,
        force,
        name,
        need,
        |mut out| {
            let s = c.restore(name, &mut out)?;
            damaged = s.damaged;
            Ok(s.bytes)
        },
        None,
    )?;
    let code = name_damage(name, &damaged, check);
    if json {
        print_json(&serde_json::json!({
            "name": name,
            "target": target.display().to_string(),
            "bytes": n,
            "damaged": damaged,
        }))?;
        return Ok(code);
    }
    outln!(
        "Restored {} of backup {name} to {}.",
        format_size(n),
        target.display()
    );
    Ok(code)
}
