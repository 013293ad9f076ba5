//! `dedup restore`: a backup of files into a directory (see
//! `restore_files.rs`), or a backup's stream to a new file or to stdout.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use dedup_store::RepoLocation;

use anyhow::{bail, Context};
use dedup_core::size::format_size;

use super::restore_target::FillAt;
use super::shared::repo::open_read_only;
use super::shared::report::{mb_per_sec, name_damage, print_json};

#[derive(clap::Args)]
#[command(
    about = "Restore a backup of files into a directory, or of a stream to a file, standard output or a stopped dedup device",
    after_help = "Restoring reads the backup's recipe and the containers it names; every segment is checked against its catalog. Damage costs only what needs it: a restore goes on past a damaged or missing container, catalog or recipe part, writes everything intact, names on stderr (and in --json, as \"damaged\") each file or byte range it could not restore (left as a hole, or zeros in a stream), and exits with status 1. A damaged backup object, recipe (of a stream) or tree is refused by name (status 2): nothing of that backup can be found without it. --include reads only what the paths asked for need.\n\nA backup of files is restored under the directory TARGET (paths as stored: a backup of /home/me restores to TARGET/home/me), with modes, times, symlinks, hard links, and owners when run as root. TARGET must be empty or absent unless --force (what is in the way is then replaced). --include PATH restores only what is at or under PATH (as stored, e.g. home/me/docs) and the directories leading to it. A restore that fails part-way leaves what it made so far.\n\nA backup of a stream is written to the file TARGET, which must not exist unless --force (it is then replaced, keeping its mode, and its owner when run as root: the restore writes a new file beside it and renames it into place, so a restore that fails leaves the old file as it was; the file system needs room for both until the rename, and the new file is a new inode: other hard links to the old one keep the old bytes, and extended attributes and ACLs are not carried over; a device is written in place, a fifo once something opens it to read; a block device that is mounted or in use, or smaller than the backup, is refused before anything is written; a new file is made 0600; a symbolic link is replaced itself with --force, as a new file, never written through, unless it names a device, which is then written), or to standard output with `-`. Ctrl-C or SIGTERM stops a stream restore at its next write: a file target is left as it was, with no temporary copy behind; a second one ends it at once.\n\nWith --device DIR, a backup of a stream (a device's image, from `dedup backup --device` or `--stdin`) is restored onto the stopped dedup device in DIR, from its first byte, by fingerprint: each block is named by its segment's fingerprint (from the container's catalog) and compared with what the device holds; a block it holds already is left alone, a zero block is trimmed, a block whose chunk the device stores elsewhere is mapped to that chunk (a reference: no data read or written), and only the rest is read from the repository and written. This needs a repository of fixed segments of the device's chunk size (as `backup --device` does); from an encrypted one that keys the plain digest (every one made since 2026-12-01) blocks are compared the same way but none is mapped (a keyed fingerprint cannot name the device's chunk), so what differs is written; from any other (an encrypted one made before then included), the image is written whole (the device still stores each chunk once), and the report says why. The device must be at least as large as the image (blocks past it are left as they are) and stopped; one holding data needs --force. A damaged range is written as zeros and named (status 1). A restore that stops part-way leaves the device part restored: run it again.\n\nExamples:\n  dedup restore ./repo home-monday /restore\n  dedup restore ./repo home-monday /restore --include home/me/docs\n  dedup restore ./repo db-1 db.sql\n  dedup restore ./repo db-1 - | psql\n  dedup restore ./repo vm-1 --device /var/lib/dedup/vm --force"
)]
pub struct Args {
    /// Repository directory.
    pub repo: RepoLocation,
    /// Backup to restore (see `dedup list`).
    pub name: String,
    /// Directory to restore files into; for a stream, the file to create
    /// or `-` for standard output.
    #[arg(required_unless_present = "device", conflicts_with = "device")]
    pub target: Option<PathBuf>,
    /// Restore a stream backup (a device's image) onto the stopped dedup
    /// device in DIR, from its first byte, by fingerprint: blocks it holds
    /// already are left alone, blocks whose chunks it stores elsewhere are
    /// mapped to them, and only the rest is read and written. The device
    /// must be at least as large as the image; one holding data needs
    /// --force.
    #[arg(long, value_name = "DIR")]
    pub device: Option<PathBuf>,
    /// Restore into a non-empty directory, replace an existing file, or
    /// replace a device's data (--device).
    #[arg(long)]
    pub force: bool,
    /// Restore only this path of a backup of files, and what is under it
    /// (repeat for more).
    #[arg(long, value_name = "PATH")]
    pub include: Vec<PathBuf>,
    /// Print the report as JSON (of a restore of files, to a file, or onto a device).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &a.device {
        if !a.include.is_empty() {
            bail!("--include is for backups of files; --device restores a stream");
        }
        return super::restore_device::run(&a.repo, &a.name, dir, a.force, a.json);
    }
    let a = Target {
        target: a.target.expect("clap requires TARGET without --device"),
        repo: a.repo,
        name: a.name,
        force: a.force,
        include: a.include,
        json: a.json,
    };
    let repo = open_read_only(&a.repo)?;
    // Fail on an unknown name before creating the target.
    let record = repo.backup(&a.name)?;
    if record.tree.is_some() {
        if a.target.as_os_str() == "-" {
            bail!("backup {} holds files and directories: restore it into a directory, not to standard output", a.name);
        }
        return super::restore_files::run(
            &repo, &a.repo, &a.name, &a.target, &a.include, a.force, a.json,
        );
    }
    if !a.include.is_empty() {
        bail!(
            "backup {} is a stream: --include is for backups of files",
            a.name
        );
    }
    if a.json && a.target.as_os_str() == "-" {
        bail!("--json and `-` would both write to standard output: give a file");
    }
    let start = Instant::now();
    // Past damage: what is intact is written, each damaged range as zeros
    // (what follows keeps its offset) and named, by whichever way wrote
    // the stream (in order, or at offsets); the exit status is 1.
    let damaged = std::cell::RefCell::new(Vec::new());
    if a.target.as_os_str() == "-" {
        let stdout = io::stdout();
        let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
        let salvage = repo.restore_salvage(&a.name, &mut out)?;
        out.flush().context("writing to standard output")?;
        let (n, s) = (salvage.bytes, start.elapsed().as_secs_f64());
        eprintln!(
            "Restored {} of backup {} to standard output ({:.1} s, {:.1} MB/s).",
            format_size(n),
            a.name,
            s,
            mb_per_sec(n, s)
        );
        return Ok(name_damage(&a.name, &salvage.damaged, &check_hint(&a)));
    }
    let n = super::restore_target::restore_to(
        &a.target,
        a.force,
        &a.name,
        Some(record.report.bytes_in),
        |out| {
            let salvage = repo.restore_salvage(&a.name, out)?;
            *damaged.borrow_mut() = salvage.damaged;
            Ok(salvage.bytes)
        },
        repo.restores_at_offsets().then(|| -> FillAt {
            Box::new(|out| {
                let salvage = repo.restore_salvage_at(&a.name, out)?;
                *damaged.borrow_mut() = salvage.damaged;
                Ok(salvage.bytes)
            })
        }),
    )?;
    let damaged = damaged.into_inner();
    let s = start.elapsed().as_secs_f64();
    let code = name_damage(&a.name, &damaged, &check_hint(&a));
    if a.json {
        print_json(&serde_json::json!({
            "name": a.name,
            "target": a.target.display().to_string(),
            "bytes": n,
            "seconds": s,
            "mb_per_sec": mb_per_sec(n, s),
            "damaged": damaged,
        }))?;
        return Ok(code);
    }
    outln!(
        "Restored {} of backup {} to {} ({:.1} s, {:.1} MB/s).",
        format_size(n),
        a.name,
        a.target.display(),
        s,
        mb_per_sec(n, s)
    );
    Ok(code)
}

/// A restore to a directory, a file or standard output.
struct Target {
    repo: RepoLocation,
    name: String,
    target: PathBuf,
    force: bool,
    include: Vec<PathBuf>,
    json: bool,
}

/// What to run to learn what is damaged in `a`'s repository.
fn check_hint(a: &Target) -> String {
    format!("`dedup store check {}`", a.repo)
}
