//! A metadata device that stops taking writes after a failed sync.
//!
//! Linux reports a failed writeback once and may drop the pages it could
//! not write (PostgreSQL's "fsyncgate"): a later sync that succeeds says
//! nothing about them. The data path stops the device on such a failure
//! (`placement`); this does the same for a journaled store's metadata file,
//! so no FLUSH after the failure can acknowledge metadata the kernel may
//! have lost. From the first failed sync, or a write failing otherwise than
//! for space, every write and sync fails with the first error; reads go on.
//! A restart replays the journal from what is really on disk.
//!
//! A write refused for lack of space (ENOSPC) is not latched: it dirtied
//! nothing, and the engine retries it once space is freed.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use super::BlockFile;
use crate::error::{Error, Result};

pub struct Latched {
    inner: Arc<dyn BlockFile>,
    /// The first failure: what failed and its errno.
    failed: Mutex<Option<(String, i32)>>,
}

impl Latched {
    pub fn new(inner: Arc<dyn BlockFile>) -> Latched {
        Latched {
            inner,
            failed: Mutex::new(None),
        }
    }

    fn refuse(&self) -> Result<()> {
        match &*self.failed.lock() {
            None => Ok(()),
            Some((what, errno)) => Err(Error::io(
                format!(
                    "{}: an earlier {what}, and the kernel may have dropped metadata it could not write, \
                     so no later sync can prove it durable; the device takes no more writes: stop it and \
                     serve it again (its journal replays what is on disk), after fixing the disk",
                    self.inner.describe()
                ),
                std::io::Error::from_raw_os_error(*errno),
            )),
        }
    }

    fn latch(&self, what: &str, e: &Error) {
        let mut failed = self.failed.lock();
        if failed.is_none() {
            tracing::error!(
                "{}: {what} failed ({e}); the metadata takes no more writes until a restart",
                self.inner.describe()
            );
            *failed = Some((format!("{what} failed ({e})"), e.errno()));
        }
    }
}

impl BlockFile for Latched {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.refuse()?;
        let r = self.inner.write_at(buf, offset);
        if let Err(e) = &r {
            if e.errno() != libc::ENOSPC {
                self.latch("write", e);
            }
        }
        r
    }

    fn sync(&self) -> Result<()> {
        self.refuse()?;
        let r = self.inner.sync();
        if let Err(e) = &r {
            self.latch("sync", e);
        }
        r
    }

    fn len(&self) -> Result<u64> {
        self.inner.len()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn capacity(&self) -> Result<Option<u64>> {
        self.inner.capacity()
    }

    fn allocated(&self) -> Result<Option<u64>> {
        self.inner.allocated()
    }

    fn data_ranges(&self, range: Range<u64>) -> Result<Option<Vec<Range<u64>>>> {
        self.inner.data_ranges(range)
    }

    fn punch(&self, offset: u64, len: u64) -> Result<()> {
        self.refuse()?;
        self.inner.punch(offset, len)
    }

    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        self.refuse()?;
        self.inner.preallocate(offset, len)
    }

    fn ordered_io(&self) -> bool {
        self.inner.ordered_io()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::sim::{PowerSwitch, SimDisk};

    #[test]
    fn a_failed_sync_refuses_every_later_write_and_sync_but_not_reads() {
        let power = PowerSwitch::cutting_at(1);
        let disk = Arc::new(SimDisk::new(8192, "meta", power.clone()));
        let l = Latched::new(disk);
        l.write_at(&[1; 512], 0).unwrap();
        assert!(l.sync().is_err(), "the cut fails the sync");
        let e = l.sync().unwrap_err().to_string();
        assert!(
            e.contains("an earlier sync failed") && e.contains("serve it again"),
            "{e}"
        );
        assert!(l.write_at(&[2; 512], 0).is_err());
    }

    #[test]
    fn a_write_refused_for_space_is_not_latched() {
        struct Full;
        impl BlockFile for Full {
            fn read_at(&self, buf: &mut [u8], _: u64) -> Result<()> {
                buf.fill(0);
                Ok(())
            }
            fn write_at(&self, _: &[u8], _: u64) -> Result<()> {
                Err(Error::io(
                    "full",
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                ))
            }
            fn sync(&self) -> Result<()> {
                Ok(())
            }
            fn len(&self) -> Result<u64> {
                Ok(4096)
            }
            fn describe(&self) -> String {
                "full".into()
            }
            fn capacity(&self) -> Result<Option<u64>> {
                Ok(None)
            }
        }
        let l = Latched::new(Arc::new(Full));
        assert!(l.write_at(&[1; 512], 0).is_err());
        l.sync().unwrap();
        let mut b = [1u8; 16];
        l.read_at(&mut b, 0).unwrap();
    }
}
