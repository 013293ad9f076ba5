//! The journaled stores (sparse, disktable) on a host filesystem that is
//! full, modelled by files that share a quota of 4 KiB pages: a write to a
//! page not yet allocated fails with ENOSPC past the quota, a punch gives
//! its whole pages back, a preallocation takes pages (like fallocate). The
//! device must stop cleanly while the host is full (a save needs no new
//! room: the journal's blocks are reserved at open), give space back
//! through a TRIM while writes stall for space, and resume the stalled
//! write once the room its error names is freed.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{MemDevice, ModelDisk};
use dedup_core::backends::BackendParams;
use dedup_core::blockfile::BlockFile;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{Device, Result};
use parking_lot::Mutex;

const CS: usize = 4096;
const PAGE: u64 = 4096;
const LBNS: u64 = 2048;

/// The host filesystem: the pages each file has allocated, and how many
/// it may hold in all.
#[derive(Default)]
struct Host {
    pages: Mutex<(HashSet<(usize, u64)>, u64)>,
}

impl Host {
    fn used(&self) -> u64 {
        self.pages.lock().0.len() as u64
    }
    /// Full: no page left.
    fn fill(&self) {
        let mut p = self.pages.lock();
        p.1 = p.0.len() as u64;
    }
    fn free_bytes(&self, bytes: u64) {
        self.pages.lock().1 += bytes.div_ceil(PAGE);
    }
    /// Take the pages of `[offset, offset + len)` of file `id`, all or none.
    fn take(&self, id: usize, offset: u64, len: u64) -> Result<()> {
        let mut p = self.pages.lock();
        let wanted: Vec<_> = (offset / PAGE..(offset + len).div_ceil(PAGE))
            .map(|page| (id, page))
            .filter(|k| !p.0.contains(k))
            .collect();
        if p.0.len() as u64 + wanted.len() as u64 > p.1 {
            return Err(dedup_core::Error::io(
                format!("file {id}: {len} bytes at {offset}"),
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        p.0.extend(wanted);
        Ok(())
    }
}

/// A regular file on `Host` (so its capacity is unbounded).
struct HostFile {
    inner: Arc<dyn BlockFile>,
    id: usize,
    host: Arc<Host>,
}

impl HostFile {
    /// Over `inner`, whose pages other than zeros count as allocated.
    fn new(inner: Arc<dyn BlockFile>, id: usize, host: &Arc<Host>) -> HostFile {
        let len = inner.len().unwrap();
        let mut buf = vec![0u8; PAGE as usize];
        for page in 0..len / PAGE {
            inner.read_at(&mut buf, page * PAGE).unwrap();
            if buf.iter().any(|&b| b != 0) {
                let mut p = host.pages.lock();
                p.0.insert((id, page));
                p.1 += 1;
            }
        }
        HostFile {
            inner,
            id,
            host: host.clone(),
        }
    }
}

impl BlockFile for HostFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.host.take(self.id, offset, buf.len() as u64)?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> Result<u64> {
        self.inner.len()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capacity(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    fn punch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.punch(offset, len)?;
        let mut p = self.host.pages.lock();
        for page in offset.div_ceil(PAGE)..(offset + len) / PAGE {
            p.0.remove(&(self.id, page));
        }
        Ok(())
    }
    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        self.host.take(self.id, offset, len)
    }
}

/// A device of `backend` with a write-back queue of `write_back` bytes
/// (0: off), and the host its two files share (room for all at first).
fn device(backend: &str, write_back: u64) -> (MemDevice, Arc<Host>, Device) {
    let cfg = common::config(backend, CS as u32, LBNS, 2 * LBNS, HashAlgo::Blake3, false);
    let params = BackendParams {
        cache_bytes: 256 << 10,
        ..BackendParams::default()
    };
    let mut md = MemDevice::format(cfg, &params);
    md.write_back_bytes = write_back;
    let host = Arc::new(Host::default());
    host.free_bytes(1 << 30);
    let data = HostFile::new(md.data.clone(), 0, &host);
    let meta = HostFile::new(md.meta.clone(), 1, &host);
    let dev = md.open_on(Box::new(data), Box::new(meta)).unwrap();
    (md, host, dev)
}

/// `chunks` distinct incompressible chunks from `seed` on.
fn unique(seed: u64, chunks: u64) -> Vec<u8> {
    (seed..seed + chunks)
        .flat_map(|s| dedup_core::testdata::noise(s, CS))
        .collect()
}

fn reopen_holds(md: &MemDevice, model: &ModelDisk, what: &str) {
    let dev = md.open().unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    assert!(
        common::read_all(&dev) == model.bytes,
        "{what}: data differs after the stop"
    );
    common::assert_consistent(&dev);
}

const BACKENDS: [&str; 2] = ["sparse", "disktable"];

/// Metadata made dirty by applied writes, then every page of the host
/// taken: the stop saves it all the same, cleanly.
#[test]
fn a_stop_while_the_host_is_full_saves_the_metadata_cleanly() {
    for backend in BACKENDS {
        // No write-back: every write is applied before it returns.
        let (md, host, dev) = device(backend, 0);
        let mut model = ModelDisk::new(LBNS as usize * CS, CS);
        let first = unique(1, 256);
        dev.write(0, &first, false).unwrap();
        model.write(0, &first);
        dev.flush().unwrap();
        // Overwrites and new LBNs, applied (flushed to data, not committed
        // twice over: the commit below is what the stop must write).
        let second = unique(5000, 512);
        dev.write(128 * CS as u64, &second, false).unwrap();
        model.write(128 * CS as u64, &second);
        host.fill();
        dev.close()
            .unwrap_or_else(|e| panic!("{backend}: a stop on a full host: {e}"));
        drop(dev);
        reopen_holds(&md, &model, backend);
    }
}

/// A device whose first `first` chunks are written and flushed, then the
/// host filled and 128 new chunks written at LBN 1024: queued, they stall
/// for space. Every flush now fails with the stall's error, returned.
fn stalled(backend: &str, first: u64) -> (MemDevice, Arc<Host>, Device, ModelDisk, String) {
    let (md, host, dev) = device(backend, 1 << 20);
    let mut model = ModelDisk::new(LBNS as usize * CS, CS);
    let bytes = unique(1, first);
    dev.write(0, &bytes, false).unwrap();
    model.write(0, &bytes);
    dev.flush().unwrap();
    host.fill();
    let stalled = unique(9000, 128);
    dev.write(1024 * CS as u64, &stalled, false)
        .unwrap_or_else(|e| panic!("{backend}: the write is queued: {e}"));
    model.write(1024 * CS as u64, &stalled);
    let e = dev.flush().expect_err("a flush on a full host fails");
    (md, host, dev, model, e.to_string())
}

/// Writes stall for space; a TRIM of data nothing queued touches is
/// committed at once, after a collection, and gives its chunks back to
/// the host.
#[test]
fn a_trim_while_writes_stall_for_space_gives_space_back() {
    for backend in BACKENDS {
        let (md, host, dev, mut model, _) = stalled(backend, 512);
        let before = host.used();
        dev.discard(0, 512 * CS as u64, false)
            .unwrap_or_else(|e| panic!("{backend}: a trim while writes stall: {e}"));
        model.zero(0, 512 * CS as u64);
        let given = before.saturating_sub(host.used());
        assert!(
            given >= 256,
            "{backend}: a trim of 512 chunks gave back {given} pages"
        );
        common::flush_until_ok(&dev);
        dev.close().unwrap();
        drop(dev);
        reopen_holds(&md, &model, backend);
    }
}

/// Writes stall for space; the error says how much to free; freeing that
/// lets the stalled write apply (no restart).
#[test]
fn freeing_what_the_stall_names_lets_the_stalled_write_apply() {
    for backend in BACKENDS {
        let (md, host, dev, model, text) = stalled(backend, 256);
        let mb: u64 = text
            .split("free at least ")
            .nth(1)
            .and_then(|s| s.split(" MB").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{backend}: the stall says how much to free: {text}"));
        host.free_bytes(mb * 1_000_000);
        let until = Instant::now() + Duration::from_secs(20);
        while let Err(e) = dev.flush() {
            assert!(
                Instant::now() < until,
                "{backend}: {mb} MB freed, the write still stalls: {e}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        dev.close().unwrap();
        drop(dev);
        reopen_holds(&md, &model, backend);
    }
}
