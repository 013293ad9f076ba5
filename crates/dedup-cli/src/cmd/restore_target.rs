//! Where a restored stream goes, for `dedup restore` and `dedup store
//! remote restore` alike: a new file (0600); an existing file only with
//! `--force`, replaced by a new file written beside it and renamed into
//! place, so a restore that fails leaves the old one as it was; or a
//! device, written in place, and refused before anything is written if
//! it is smaller than the stream.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{bail, Context};
use dedup_core::size::format_size;

/// Restore backup `name`'s stream into `target` with `fill`, which writes
/// it and returns its length; `need`, its length if known beforehand.
/// The bytes restored.
pub fn restore_to(
    target: &Path,
    force: bool,
    name: &str,
    need: Option<u64>,
    fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<u64>,
) -> anyhow::Result<u64> {
    let as_it_was = |e: anyhow::Error| {
        e.context(format!(
            "restoring backup {name} ({} is as it was)",
            target.display()
        ))
    };
    match fs::metadata(target) {
        // A device (a disk to put an image back on): written in place.
        Ok(m) if !m.is_file() && !m.is_dir() => {
            if !force {
                bail!(
                    "{} already exists; refusing to overwrite it (use --force to write the backup onto it)",
                    target.display()
                );
            }
            let mut file = OpenOptions::new()
                .write(true)
                .open(target)
                .with_context(|| format!("opening {}", target.display()))?;
            fits_on_device(name, need, target, &mut file)?;
            super::write_behind::write_synced(file, fill).map_err(|e| {
                e.context(format!(
                    "restoring backup {name} onto {} (it holds what was written before the error)",
                    target.display()
                ))
            })
        }
        Ok(m) if m.is_dir() => bail!(
            "{} is a directory; backup {name} is a stream: give a file to restore it into",
            target.display()
        ),
        Ok(_) if !force => bail!(
            "{} already exists; refusing to overwrite it (use --force to replace it)",
            target.display()
        ),
        Ok(_) => {
            // Through a symlink, the file it names is replaced.
            let real = fs::canonicalize(target)
                .with_context(|| format!("resolving {}", target.display()))?;
            replace_file(&real, true, fill).map_err(as_it_was)
        }
        // A symlink to nothing: refused before any work, not after.
        Err(e) if e.kind() == io::ErrorKind::NotFound && target.is_symlink() => bail!(
            "{} is a symbolic link to a file that does not exist; give the file's own path",
            target.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            replace_file(target, false, fill).map_err(as_it_was)
        }
        Err(e) => Err(anyhow::anyhow!("looking at {}: {e}", target.display())),
    }
}

/// Refuse, before writing anything, a block device smaller than the
/// stream (its size is where its end is). A character device or a fifo
/// has none to tell, and is written as it comes.
fn fits_on_device(
    name: &str,
    need: Option<u64>,
    device: &Path,
    file: &mut File,
) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Some(need) = need else { return Ok(()) };
    if !file.metadata()?.file_type().is_block_device() {
        return Ok(());
    }
    let size = file
        .seek(SeekFrom::End(0))
        .and_then(|end| file.seek(SeekFrom::Start(0)).map(|_| end))
        .with_context(|| format!("finding the size of {}", device.display()))?;
    if size < need {
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
    target: &Path,
    replace: bool,
    fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<u64>,
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
    let n = super::write_behind::write_synced(tmp.as_file().try_clone()?, fill)?;
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
