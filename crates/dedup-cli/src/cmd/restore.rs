//! `dedup restore`: a backup of files into a directory (see
//! `restore_files.rs`), or a backup's stream to a new file or to stdout.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use dedup_core::size::format_size;

use super::backup::mb_per_sec;

#[derive(clap::Args)]
#[command(
    about = "Restore a backup of files into a directory, or of a stream to a file or standard output",
    after_help = "Restoring reads the backup's recipe and the containers it names; every segment is checked against its catalog, and a damaged or missing container, recipe or tree is refused by name.\n\nA backup of files is restored under the directory TARGET (paths as stored: a backup of /home/me restores to TARGET/home/me), with modes, times, symlinks, hard links, and owners when run as root. TARGET must be empty or absent unless --force (what is in the way is then replaced). --include PATH restores only what is at or under PATH (as stored, e.g. home/me/docs) and the directories leading to it. A restore that fails part-way leaves what it made so far.\n\nA backup of a stream is written to the file TARGET, which must not exist unless --force (it is then replaced, keeping its mode: the restore writes a new file beside it and renames it into place, so a restore that fails leaves the old file as it was; a device is written in place, unless it is smaller than the backup, which is refused before anything is written; a new file is made 0600), or to standard output with `-`.\n\nExamples:\n  dedup restore ./repo home-monday /restore\n  dedup restore ./repo home-monday /restore --include home/me/docs\n  dedup restore ./repo db-1 db.sql\n  dedup restore ./repo db-1 - | psql"
)]
pub struct Args {
    /// Repository directory.
    pub repo: PathBuf,
    /// Backup to restore (see `dedup list`).
    pub name: String,
    /// Directory to restore files into; for a stream, the file to create
    /// or `-` for standard output.
    pub target: PathBuf,
    /// Restore into a non-empty directory, or replace an existing file.
    #[arg(long)]
    pub force: bool,
    /// Restore only this path of a backup of files, and what is under it
    /// (repeat for more).
    #[arg(long, value_name = "PATH")]
    pub include: Vec<PathBuf>,
    /// Print the report of a restore of files as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let repo = super::store::open_read_only(&a.repo)?;
    // Fail on an unknown name before creating the target.
    let record = repo.backup(&a.name)?;
    if record.tree.is_some() {
        if a.target.as_os_str() == "-" {
            bail!("backup {} holds files and directories: restore it into a directory, not to standard output", a.name);
        }
        return super::restore_files::run(&repo, &a);
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
    if a.target.as_os_str() == "-" {
        let stdout = io::stdout();
        let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
        let n = repo.restore(&a.name, &mut out)?;
        out.flush().context("writing to standard output")?;
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "Restored {} of backup {} to standard output ({:.1} s, {:.1} MB/s).",
            format_size(n),
            a.name,
            s,
            mb_per_sec(n, s)
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A device is written in place: what a failed restore wrote stays.
    let mut in_place = false;
    let written = match fs::metadata(&a.target) {
        // A device (a disk to put an image back on): written in place.
        Ok(m) if !m.is_file() && !m.is_dir() => {
            if !a.force {
                bail!(
                    "{} already exists; refusing to overwrite it (use --force to write the backup onto it)",
                    a.target.display()
                );
            }
            let mut file = OpenOptions::new()
                .write(true)
                .open(&a.target)
                .with_context(|| format!("opening {}", a.target.display()))?;
            fits_on_device(&repo, &a.name, &a.target, &mut file)?;
            in_place = true;
            write_to(&repo, &a.name, file)
        }
        Ok(m) if m.is_dir() => bail!(
            "{} is a directory; backup {} is a stream: give a file to restore it into",
            a.target.display(),
            a.name
        ),
        Ok(_) if !a.force => bail!(
            "{} already exists; refusing to overwrite it (use --force to replace it)",
            a.target.display()
        ),
        Ok(_) => {
            // Through a symlink, the file it names is replaced.
            let real = fs::canonicalize(&a.target)
                .with_context(|| format!("resolving {}", a.target.display()))?;
            replace_file(&repo, &a.name, &real, true)
        }
        // A symlink to nothing: refused before any work, not after.
        Err(e) if e.kind() == io::ErrorKind::NotFound && a.target.is_symlink() => bail!(
            "{} is a symbolic link to a file that does not exist; give the file's own path",
            a.target.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            replace_file(&repo, &a.name, &a.target, false)
        }
        Err(e) => Err(anyhow::anyhow!("looking at {}: {e}", a.target.display())),
    };
    match written {
        Ok(n) => {
            let s = start.elapsed().as_secs_f64();
            if a.json {
                super::print_json(&serde_json::json!({
                    "name": a.name,
                    "target": a.target.display().to_string(),
                    "bytes": n,
                    "seconds": s,
                    "mb_per_sec": mb_per_sec(n, s),
                }))?;
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "Restored {} of backup {} to {} ({:.1} s, {:.1} MB/s).",
                format_size(n),
                a.name,
                a.target.display(),
                s,
                mb_per_sec(n, s)
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if in_place => Err(e.context(format!(
            "restoring backup {} onto {} (it holds what was written before the error)",
            a.name,
            a.target.display()
        ))),
        Err(e) => Err(e.context(format!(
            "restoring backup {} ({} is as it was)",
            a.name,
            a.target.display()
        ))),
    }
}

/// Refuse, before writing anything, a device smaller than backup `name`'s
/// stream (a block device's size is where its end is; a character device
/// has none to tell, and is written as it comes).
fn fits_on_device(
    repo: &dedup_store::Repository,
    name: &str,
    device: &Path,
    file: &mut File,
) -> anyhow::Result<()> {
    use std::io::{Seek, SeekFrom};
    let need = repo.backup(name)?.report.bytes_in;
    let size = file.seek(SeekFrom::End(0)).unwrap_or(0);
    file.seek(SeekFrom::Start(0))
        .with_context(|| format!("seeking on {}", device.display()))?;
    if size > 0 && size < need {
        bail!(
            "backup {name} is {} ({need} bytes) and {} holds only {} ({size} bytes); nothing was written: give a device at least as large",
            format_size(need),
            device.display(),
            format_size(size)
        );
    }
    Ok(())
}

/// Restore into a new file beside `target`, synced, then renamed onto it: a
/// restore that fails leaves `target` as it was (absent, or the old file
/// when `replace`), never half written. A new file is private (0600); one
/// that replaces a file takes that file's mode, and its owner when we may
/// give it (as root).
fn replace_file(
    repo: &dedup_store::Repository,
    name: &str,
    target: &Path,
    replace: bool,
) -> anyhow::Result<u64> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".dedup-restore-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    if replace {
        let old =
            fs::metadata(target).with_context(|| format!("looking at {}", target.display()))?;
        tmp.as_file().set_permissions(old.permissions())?;
        // Only root may give a file away; anyone else keeps it as theirs.
        use std::os::unix::fs::MetadataExt;
        let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(old.uid()), Some(old.gid()));
    }
    let n = write_to(repo, name, tmp.as_file().try_clone()?)?;
    if replace {
        tmp.persist(target)?;
    } else {
        // Someone may have made `target` meanwhile: never replace theirs.
        tmp.persist_noclobber(target).map_err(|e| {
            anyhow::anyhow!(
                "{} appeared during the restore; it was left alone ({})",
                target.display(),
                e.error
            )
        })?;
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))?;
    Ok(n)
}

fn write_to(repo: &dedup_store::Repository, name: &str, file: File) -> anyhow::Result<u64> {
    super::write_behind::write_synced(file, |out| repo.restore(name, out))
}
