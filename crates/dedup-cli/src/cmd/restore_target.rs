//! Where a restored stream goes, for `dedup restore` and `dedup store
//! remote restore` alike: a new file (0600); an existing file only with
//! `--force`, replaced by a new file written beside it and renamed into
//! place, so a restore that fails leaves the old one as it was; or a
//! device, written in place: a block device is opened exclusively (one
//! that is mounted or in use is refused) and refused before anything is
//! written if it is smaller than the stream; a fifo once something opens
//! it to read (the restore says it waits). Ctrl-C (or SIGTERM, SIGHUP)
//! stops a restore at its next write as a failure, so a file's temporary
//! copy is removed; a second one ends the process at once.

use std::cell::Cell;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use dedup_core::size::format_size;
use dedup_store::WriteAt;

/// Restore backup `name`'s stream into `target` with `fill`, which writes
/// it and returns its length; `need`, its length if known beforehand
/// (needed for a block device: one smaller is refused, and no more than
/// that is written to it). The bytes restored.
///
/// Where the target is a new file (every case but a device), `fill_at`,
/// if given, writes it instead, at any offset and from several threads:
/// a repository then reads each container once, not once per return of
/// the stream to it (`Repository::restore_salvage_at`).
pub fn restore_to(
    target: &Path,
    force: bool,
    name: &str,
    need: Option<u64>,
    fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<u64>,
    fill_at: Option<FillAt<'_>>,
) -> anyhow::Result<u64> {
    let stop = Stop::install()?;
    let fill_at = fill_at.map(|f| {
        let stop = &stop.flag;
        move |file: &File| f(&super::write_behind::WriteBehindAt::new(file, stop))
    });
    // Bytes handed to the target's writer, for an error part-way onto a
    // device: at most these reached it.
    let taken = Cell::new(0u64);
    let fill = |out: &mut dyn Write| {
        fill(&mut Interruptible {
            out,
            stop: &stop.flag,
            taken: &taken,
        })
    };
    let link = fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink());
    match fs::metadata(target) {
        // A device (a disk to put an image back on): written in place,
        // also through a symlink (disks are named by /dev/disk/by-id/*).
        Ok(m) if !m.is_file() && !m.is_dir() => {
            if !force {
                bail!(
                    "{} already exists; refusing to overwrite it (use --force to write the backup onto it)",
                    target.display()
                );
            }
            let (block, fifo) = (m.file_type().is_block_device(), m.file_type().is_fifo());
            let mut open = OpenOptions::new();
            open.write(true);
            if block {
                // Mounted, stacked on, or held by another exclusive user:
                // refused by name (`guard`, as `dedup create` does); the
                // exclusive open below (EBUSY) keeps it so while writing.
                drop(dedup_core::guard::not_in_use(target)?);
                open.custom_flags(libc::O_EXCL);
            }
            let mut file = match fifo {
                true => open_fifo(target, &stop.flag)?,
                false => open.open(target).with_context(|| {
                    format!("opening {} (mounted, or in use?)", target.display())
                })?,
            };
            let cap = match (block, need) {
                (true, Some(need)) => {
                    fits_on_device(name, need, target, &mut file)?;
                    Some(need)
                }
                (true, None) => bail!(
                    "the length of backup {name} is unknown, so it cannot be checked against {}: restore it to a file",
                    target.display()
                ),
                (false, _) => None,
            };
            super::write_behind::write_synced(file, |out| match cap {
                Some(need) => {
                    let mut capped = Capped { out, left: need };
                    let n = fill(&mut capped)?;
                    if n != need {
                        bail!(
                            "the backup's stream was {n} bytes, not the {need} it was listed with"
                        );
                    }
                    Ok(n)
                }
                None => fill(out),
            })
            .map_err(|e| {
                let n = taken.get();
                e.context(format!(
                    "restoring backup {name} onto {}: at most the stream's first {} ({n} bytes) were written to it before the error; past them it is as it was",
                    target.display(),
                    format_size(n)
                ))
            })
        }
        // Any other symlink (to a file, a directory, nothing) is replaced
        // itself, never written through: what it points at, perhaps
        // outside where the restore was asked to write, is left alone.
        _ if link && !force => bail!(
            "{} already exists (a symbolic link); refusing to replace it (use --force to replace the link itself with the restored file; what it points at is left alone)",
            target.display()
        ),
        _ if link => replace_file(name, target, Old::Link, need, fill, fill_at),
        Ok(m) if m.is_dir() => bail!(
            "{} is a directory; backup {name} is a stream: give a file to restore it into",
            target.display()
        ),
        Ok(_) if !force => bail!(
            "{} already exists; refusing to overwrite it (use --force to replace it)",
            target.display()
        ),
        Ok(_) => replace_file(name, target, Old::File, need, fill, fill_at),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            replace_file(name, target, Old::None, need, fill, fill_at)
        }
        Err(e) => Err(anyhow::anyhow!("looking at {}: {e}", target.display())),
    }
}

/// Open the fifo `path` to write, once something opens it to read. A
/// plain open would wait as long, but in the kernel, silently, and past
/// the first Ctrl-C; this one says it waits and stops at `stop`.
fn open_fifo(path: &Path, stop: &AtomicBool) -> anyhow::Result<File> {
    let mut said = false;
    let file = loop {
        // Without a reader, a non-blocking open fails at once (ENXIO).
        let opened = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        match opened {
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                if stop.load(Ordering::SeqCst) {
                    bail!(
                        "stopped by a signal while waiting for a reader of the fifo {}; nothing was written",
                        path.display()
                    );
                }
                if !said {
                    eprintln!(
                        "waiting for something to read the fifo {} (Ctrl-C to stop)",
                        path.display()
                    );
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            opened => break opened.with_context(|| format!("opening {}", path.display()))?,
        }
    };
    // Blocking again: a full pipe makes the restore wait for its reader,
    // not fail.
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL on a descriptor we own touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        let e = io::Error::last_os_error();
        return Err(anyhow::anyhow!("opening the fifo {}: {e}", path.display()));
    }
    Ok(file)
}

/// Refuse, before writing anything, a block device smaller than the
/// stream (its size is where its end is).
fn fits_on_device(name: &str, need: u64, device: &Path, file: &mut File) -> anyhow::Result<()> {
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

/// Signal handlers that turn the first SIGINT, SIGTERM or SIGHUP into a
/// flag, and a second into an exit (status 130), for as long as it lives.
struct Stop {
    flag: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Stop {
    fn install() -> anyhow::Result<Stop> {
        let flag = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // A signal ignored when we started stays ignored: `nohup`, or
            // a background job of a script (SIGINT), asked for that.
            if ignored(sig) {
                continue;
            }
            // The exit first: it sees the flag as the signal before set it.
            ids.push(signal_hook::flag::register_conditional_shutdown(
                sig,
                130,
                Arc::clone(&flag),
            )?);
            ids.push(signal_hook::flag::register(sig, Arc::clone(&flag))?);
        }
        Ok(Stop { flag, ids })
    }
}

/// Whether `sig` is ignored (SIG_IGN) in this process now.
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A writer that fails once a stop signal came: the restore unwinds and
/// what it made is cleaned up as after any other failure.
struct Interruptible<'w> {
    out: &'w mut dyn Write,
    stop: &'w AtomicBool,
    /// Bytes `out` took so far.
    taken: &'w Cell<u64>,
}

impl Write for Interruptible<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.stop.load(Ordering::SeqCst) {
            // Not ErrorKind::Interrupted, which write_all retries.
            return Err(io::Error::other("stopped by a signal (Ctrl-C or SIGTERM)"));
        }
        let n = self.out.write(buf)?;
        self.taken.set(self.taken.get() + n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A restore that writes its target at any offset: the bytes restored.
pub type FillAt<'f> = Box<dyn FnOnce(&dyn WriteAt) -> anyhow::Result<u64> + 'f>;

/// A writer that takes at most `left` bytes more: a stream longer than
/// its backup was listed with (the backup replaced on the server between
/// the listing and the restore) must not run over the device's checked
/// size.
struct Capped<'w> {
    out: &'w mut dyn Write,
    left: u64,
}

impl Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(io::Error::other(
                "the backup's stream is longer than it was listed with (replaced meanwhile?)",
            ));
        }
        let n = self.out.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// What is at a stream restore's target before it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Old {
    None,
    File,
    /// A symlink: replaced itself, as a new file.
    Link,
}

/// Restore into a new file beside `target`, synced, then renamed onto it: a
/// restore that fails leaves `target` as it was (absent, or the old file
/// or symlink), never half written. A new file is private (0600), as is
/// one that replaces a symlink; one that replaces a file takes that file's
/// owner when we may give it (as root) and then its mode (set after the
/// owner, which clears set-id bits).
fn replace_file(
    name: &str,
    target: &Path,
    old: Old,
    need: Option<u64>,
    fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<u64>,
    fill_at: Option<impl FnOnce(&File) -> anyhow::Result<u64>>,
) -> anyhow::Result<u64> {
    let as_it_was = |e: anyhow::Error| {
        e.context(format!(
            "restoring backup {name} ({} is as it was)",
            target.display()
        ))
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let written = (|| {
        let tmp = tempfile::Builder::new()
            .prefix(".dedup-restore-")
            .tempfile_in(dir)
            .with_context(|| format!("creating a file in {}", dir.display()))?;
        let n = match fill_at {
            Some(fill_at) => {
                // Made its full length first: a direct write that extends
                // a file takes it exclusively (ext4, XFS), one inside it
                // need not.
                if let Some(len) = need {
                    tmp.as_file().set_len(len)?;
                }
                let n = fill_at(tmp.as_file())?;
                if need != Some(n) {
                    tmp.as_file().set_len(n)?;
                }
                tmp.as_file().sync_all()?;
                n
            }
            None => super::write_behind::write_synced(tmp.as_file().try_clone()?, fill)?,
        };
        if old == Old::Link {
            // rename(2) replaces the link, not what it points at.
            tmp.persist(target)?;
        } else if old == Old::File {
            let old =
                fs::metadata(target).with_context(|| format!("looking at {}", target.display()))?;
            // Only root may give a file away; anyone else keeps it as theirs.
            use std::os::unix::fs::MetadataExt;
            let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(old.uid()), Some(old.gid()));
            tmp.as_file().set_permissions(old.permissions())?;
            tmp.persist(target)?;
        } else {
            persist_new(tmp, target)?;
        }
        Ok(n)
    })()
    .map_err(as_it_was)?;
    // Renamed into place: from here on the target is the restore.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| {
            format!(
                "backup {name} was restored to {}, but syncing its directory {} failed: the rename may not survive a crash",
                target.display(),
                dir.display()
            )
        })?;
    Ok(written)
}

/// Rename `tmp` to `target`, which was absent: never over a file someone
/// made meanwhile. A file system without a no-replace rename or hard
/// links (some FUSE mounts) gets a plain rename once `target` is seen to
/// be still absent.
fn persist_new(tmp: tempfile::NamedTempFile, target: &Path) -> anyhow::Result<()> {
    let appeared = |e: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "{} appeared during the restore; it was left alone ({e})",
            target.display()
        )
    };
    match tmp.persist_noclobber(target) {
        Ok(_) => Ok(()),
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Err(appeared(&e.error)),
        Err(e) => {
            if fs::symlink_metadata(target).is_ok() {
                return Err(appeared(&e.error));
            }
            e.file
                .persist(target)
                .map(|_| ())
                .with_context(|| format!("renaming the restore to {}", target.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_writer_takes_its_length_and_refuses_a_byte_more() {
        let mut sink = Vec::new();
        let mut capped = Capped {
            out: &mut sink,
            left: 10,
        };
        capped.write_all(b"0123456789").unwrap();
        assert!(capped.write_all(b"x").is_err());
        assert_eq!(sink, b"0123456789");
    }

    #[test]
    fn a_restore_into_a_new_file_is_private_and_one_that_fails_leaves_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("new");
        let n = restore_to(
            &t,
            false,
            "b",
            None,
            |out| {
                out.write_all(b"stream")?;
                Ok(6)
            },
            None,
        )
        .unwrap();
        assert_eq!((n, fs::read(&t).unwrap()), (6, b"stream".to_vec()));
        assert_eq!(
            fs::metadata(&t).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let gone = dir.path().join("gone");
        let e = restore_to(
            &gone,
            false,
            "b",
            None,
            |out| {
                out.write_all(b"half")?;
                bail!("the repository failed")
            },
            None,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("is as it was"), "{e:#}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "only `new`");
    }
}
