//! A sync of the data device, or of the metadata store, that fails (EIO,
//! a dying disk, a full thin pool): the kernel may drop the pages it could not write and report the
//! error once, so the next sync succeeds although the bytes are gone
//! (PostgreSQL's "fsyncgate"). A device that then committed would map
//! chunks whose bytes are lost, and the FLUSH that did it would say they
//! are safe. Here every FLUSH that succeeds must be true: after a restart,
//! everything written before it reads back.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{MemDevice, Patterns};
use dedup_core::blockfile::BlockFile;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{Device, Result};
use parking_lot::Mutex;

const CS: usize = 4096;

/// A disk with a page cache: writes wait in RAM until a sync; a sync that
/// fails drops them, as Linux does with pages it could not write back.
/// The disk grows like a file as pages are written past its end (the
/// metadata stores need that).
struct PageCache<D> {
    disk: D,
    /// "data" or "metadata", for `describe`.
    what: &'static str,
    dirty: Mutex<Vec<(u64, Vec<u8>)>>,
    fail_sync: Arc<AtomicBool>,
}

impl<D: BlockFile> PageCache<D> {
    fn new(disk: D, what: &'static str, fail_sync: &Arc<AtomicBool>) -> Self {
        PageCache {
            disk,
            what,
            dirty: Mutex::new(Vec::new()),
            fail_sync: fail_sync.clone(),
        }
    }
}

impl<D: BlockFile> BlockFile for PageCache<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset + buf.len() as u64;
        let on_disk = self.disk.len()?;
        if offset < on_disk {
            let n = (on_disk.min(end) - offset) as usize;
            self.disk.read_at(&mut buf[..n], offset)?;
            buf[n..].fill(0);
        } else {
            buf.fill(0);
        }
        for (at, bytes) in self.dirty.lock().iter() {
            let (from, to) = ((*at).max(offset), (at + bytes.len() as u64).min(end));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.dirty.lock().push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        let dirty = std::mem::take(&mut *self.dirty.lock());
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(dedup_core::Error::io(
                "injected sync failure",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        for (at, bytes) in dirty {
            self.disk.write_at(&bytes, at)?;
        }
        self.disk.sync()
    }
    fn len(&self) -> Result<u64> {
        let dirty_end = self
            .dirty
            .lock()
            .iter()
            .map(|(at, b)| at + b.len() as u64)
            .max();
        Ok(self.disk.len()?.max(dirty_end.unwrap_or(0)))
    }
    fn describe(&self) -> String {
        format!("{} (with a page cache)", self.what)
    }
    fn capacity(&self) -> Result<Option<u64>> {
        self.disk.capacity()
    }
}

fn open(md: &MemDevice, fail_sync: &Arc<AtomicBool>) -> Device {
    let data = PageCache::new(md.data.clone(), "data", fail_sync);
    md.open_on(Box::new(data), Box::new(md.meta.clone()))
        .unwrap()
}

#[test]
fn after_a_failed_data_sync_no_flush_succeeds_until_a_restart() {
    for variant in ["sparse", "sparse/lz4", "disktable", "cowbtree", "lsm/lz4"] {
        let cfg = common::config(variant, CS as u32, 32, 64, HashAlgo::Blake3, false);
        let md = MemDevice::format(cfg, &common::params(variant, Default::default()));
        let p = Patterns::new(6, CS);
        let fail = Arc::new(AtomicBool::new(false));
        let dev = open(&md, &fail);
        dev.write(0, p.chunk(1), false).unwrap();
        dev.flush().unwrap();

        dev.write(CS as u64, p.chunk(3), false).unwrap();
        fail.store(true, Ordering::SeqCst);
        assert!(
            dev.flush().is_err(),
            "{variant}: the failed sync reaches FLUSH"
        );
        fail.store(false, Ordering::SeqCst);
        // The disk works again, but the pages of the chunk written before
        // the failure are gone: no FLUSH may claim otherwise.
        let again = dev.flush();
        let more = dev.write(2 * CS as u64, p.chunk(5), false);
        let flushed_after = more.is_ok() && dev.flush().is_ok();
        drop(dev); // the restart: what the metadata committed is what counts

        let dev = open(&md, &fail);
        let mut got = vec![0u8; 3 * CS];
        dev.read(0, &mut got).unwrap();
        assert!(
            &got[..CS] == p.chunk(1),
            "{variant}: flushed before the failure, lost"
        );
        if again.is_ok() {
            assert!(
                &got[CS..2 * CS] == p.chunk(3),
                "{variant}: a FLUSH succeeded after the failed sync, but LBN 1 lost what was written"
            );
        }
        if flushed_after {
            assert!(
                &got[2 * CS..] == p.chunk(5),
                "{variant}: flushed after the failure, lost"
            );
        }
        let second = &got[CS..2 * CS];
        assert!(
            second == p.chunk(3) || second.iter().all(|&b| b == 0),
            "{variant}: LBN 1 reads neither what was written nor zeros"
        );
        common::assert_consistent(&dev);
        dev.close().unwrap();
    }
}

fn open_meta_failing(md: &MemDevice, fail_sync: &Arc<AtomicBool>) -> Device {
    let meta = PageCache::new(md.meta.clone(), "metadata", fail_sync);
    md.open_on(Box::new(md.data.clone()), Box::new(meta))
        .unwrap()
}

/// The same for the metadata store's own sync. Two answers are sound, and
/// both are seen: the cowbtree store (redb) refuses every commit after a
/// failed one until it is reopened; the sparse and disktable stores keep
/// a commit's metadata dirty until a commit succeeds, so the next one
/// writes again all that the failed sync may have dropped, and its FLUSH
/// is true. What must never happen is a FLUSH that succeeds while writes
/// it covers are lost at the restart.
#[test]
fn after_a_failed_metadata_sync_a_flush_that_succeeds_is_true() {
    for variant in ["sparse", "sparse/lz4", "disktable", "cowbtree"] {
        // A device large enough that its metadata spans many pages, and
        // writes far apart, so the commit after the failure does not
        // happen to rewrite the pages the failed one lost.
        let logical = 1u64 << 16;
        let cfg = common::config(variant, CS as u32, logical, 1024, HashAlgo::Blake3, false);
        let md = MemDevice::format(cfg, &common::params(variant, Default::default()));
        let p = Patterns::new(300, CS);
        let fail = Arc::new(AtomicBool::new(false));
        let dev = open_meta_failing(&md, &fail);
        let stride = logical / 64;
        let lbn = |k: u64| k * stride;
        for k in 0..64 {
            dev.write(lbn(k) * CS as u64, p.chunk(k as usize), false)
                .unwrap();
        }
        dev.flush().unwrap();
        // Half of them overwritten, then a FLUSH whose metadata sync fails.
        for k in (0..64).step_by(2) {
            dev.write(lbn(k) * CS as u64, p.chunk(100 + k as usize), false)
                .unwrap();
        }
        fail.store(true, Ordering::SeqCst);
        assert!(
            dev.flush().is_err(),
            "{variant}: the failed sync reaches FLUSH"
        );
        fail.store(false, Ordering::SeqCst);
        // The pages of that commit are gone from the cache. Writes to
        // other LBNs (other metadata pages), then a FLUSH that may succeed
        // only if it is true.
        let mut flushed = true;
        for k in 0..64 {
            let other = lbn(k) + stride / 2;
            flushed &= dev
                .write(other * CS as u64, p.chunk(200 + k as usize), false)
                .is_ok();
        }
        flushed &= dev.flush().is_ok();
        drop(dev);
        let dev = match md.open_on(Box::new(md.data.clone()), Box::new(md.meta.clone())) {
            Ok(d) => d,
            Err(e) => {
                assert!(!flushed, "{variant}: a FLUSH succeeded after the failed sync, and the device no longer opens: {e}");
                continue;
            }
        };
        if flushed {
            let mut got = vec![0u8; CS];
            for k in 0..64 {
                let want = if k % 2 == 0 { 100 + k } else { k };
                dev.read(lbn(k) * CS as u64, &mut got).unwrap();
                assert!(
                    got == p.chunk(want as usize),
                    "{variant}: LBN {} lost a write a successful FLUSH covered",
                    lbn(k)
                );
                dev.read((lbn(k) + stride / 2) * CS as u64, &mut got)
                    .unwrap();
                assert!(
                    got == p.chunk(200 + k as usize),
                    "{variant}: LBN {} lost",
                    lbn(k) + stride / 2
                );
            }
        }
        common::assert_consistent(&dev);
        dev.close().unwrap();
    }
}

/// The journaled stores latch a failed metadata sync as the data path
/// does: a later sync that succeeds proves nothing about the pages the
/// kernel dropped, so no FLUSH succeeds until the device is restarted, and
/// the restart (journal replay) keeps everything flushed before.
#[test]
fn after_a_failed_metadata_sync_no_flush_succeeds_until_a_restart() {
    for variant in ["sparse", "sparse/lz4", "disktable"] {
        let cfg = common::config(variant, CS as u32, 32, 64, HashAlgo::Blake3, false);
        let md = MemDevice::format(cfg, &common::params(variant, Default::default()));
        let p = Patterns::new(6, CS);
        let fail = Arc::new(AtomicBool::new(false));
        let dev = open_meta_failing(&md, &fail);
        dev.write(0, p.chunk(1), false).unwrap();
        dev.flush().unwrap();

        dev.write(CS as u64, p.chunk(3), false).unwrap();
        fail.store(true, Ordering::SeqCst);
        assert!(
            dev.flush().is_err(),
            "{variant}: the failed sync reaches FLUSH"
        );
        fail.store(false, Ordering::SeqCst);
        let again = dev.flush();
        assert!(
            again.is_err(),
            "{variant}: a FLUSH succeeded after a failed metadata sync, before a restart"
        );
        let e = again.unwrap_err().to_string();
        assert!(e.contains("serve it again"), "{variant}: {e}");
        let more = dev.write(2 * CS as u64, p.chunk(5), false);
        assert!(
            more.is_err() || dev.flush().is_err(),
            "{variant}: a later write was flushed"
        );
        assert!(
            dev.close().is_err(),
            "{variant}: a latched device is not closed cleanly"
        );
        drop(dev);

        let dev = md.open().unwrap();
        let mut got = vec![0u8; 2 * CS];
        dev.read(0, &mut got).unwrap();
        assert!(
            &got[..CS] == p.chunk(1),
            "{variant}: flushed before the failure, lost"
        );
        let second = &got[CS..];
        assert!(
            second == p.chunk(3) || second.iter().all(|&b| b == 0),
            "{variant}: LBN 1 reads neither what was written nor zeros"
        );
        common::assert_consistent(&dev);
        dev.close().unwrap();
    }
}
