//! A simulated disk for crash tests. It remembers every write since the last
//! `sync`; `crash_image` then builds what a disk could hold after a power cut:
//! everything synced, plus an arbitrary (seeded, repeatable) subset of the
//! writes since, some of them torn at 512-byte sector boundaries.
//!
//! A `PowerSwitch` shared by a device's data and metadata disks counts I/O
//! operations and cuts the power at a chosen one: from then on every call
//! fails, as if the machine had died mid-workload.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::BlockFile;
use crate::error::{Error, Result};

const SECTOR: usize = 512;

/// Counts I/O operations across disks and cuts the power at one of them.
#[derive(Debug)]
pub struct PowerSwitch {
    ops: AtomicU64,
    cut_at: AtomicU64,
    cut: AtomicBool,
}

impl Default for PowerSwitch {
    fn default() -> Self {
        PowerSwitch {
            ops: AtomicU64::new(0),
            cut_at: AtomicU64::new(u64::MAX),
            cut: AtomicBool::new(false),
        }
    }
}

impl PowerSwitch {
    /// A switch that cuts the power when operation number `op` (0-based) starts.
    pub fn cutting_at(op: u64) -> Arc<PowerSwitch> {
        let p = PowerSwitch::default();
        p.cut_at.store(op, Ordering::SeqCst);
        Arc::new(p)
    }

    /// Operations (writes and syncs) seen so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Cut the power now.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        if self.is_cut() {
            Err(Error::io(
                "simulated power cut",
                io::Error::from_raw_os_error(libc::EIO),
            ))
        } else {
            Ok(())
        }
    }

    /// Count one write or sync; fails once the cut point is reached.
    fn tick(&self) -> Result<()> {
        self.check()?;
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        if n >= self.cut_at.load(Ordering::SeqCst) {
            self.cut();
        }
        self.check()
    }
}

/// splitmix64: good bits even from tiny seeds; the repeatable random
/// numbers crash tests choose with.
pub fn splitmix(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

struct Pending {
    offset: u64,
    data: Vec<u8>,
}

struct State {
    /// What reads see: every completed write.
    current: Vec<u8>,
    /// What survives any crash: every write before the last sync.
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

/// A disk in memory with crash semantics. Writes past the end grow it, like
/// a regular file.
pub struct SimDisk {
    state: Mutex<State>,
    power: Arc<PowerSwitch>,
    name: String,
}

impl SimDisk {
    pub fn new(len: u64, name: &str, power: Arc<PowerSwitch>) -> SimDisk {
        SimDisk::from_image(vec![0; len as usize], name, power)
    }

    /// A disk whose durable contents are `image` (e.g. a crash image).
    pub fn from_image(image: Vec<u8>, name: &str, power: Arc<PowerSwitch>) -> SimDisk {
        SimDisk {
            state: Mutex::new(State {
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
            }),
            power,
            name: name.to_string(),
        }
    }

    /// Bytes written since the last sync.
    pub fn unsynced_writes(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// What the disk could hold after a power cut now: the synced contents
    /// plus each unsynced write kept with probability 1/2 (in order), and,
    /// with `tear`, some kept writes cut down to a random subset of their
    /// 512-byte sectors. `next` supplies random numbers (seeded by the caller).
    pub fn crash_image(&self, next: &mut dyn FnMut() -> u64, tear: bool) -> Vec<u8> {
        let s = self.state.lock();
        let mut image = s.durable.clone();
        for w in &s.pending {
            if next() % 2 == 0 {
                continue;
            }
            let end = w.offset as usize + w.data.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            let torn = tear && w.data.len() > SECTOR && next() % 4 == 0;
            for (i, sector) in w.data.chunks(SECTOR).enumerate() {
                if torn && next() % 2 == 0 {
                    continue;
                }
                let at = w.offset as usize + i * SECTOR;
                image[at..at + sector.len()].copy_from_slice(sector);
            }
        }
        image
    }

    /// The contents as reads see them now.
    pub fn contents(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }
}

impl BlockFile for SimDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.power.check()?;
        let s = self.state.lock();
        let start = offset as usize;
        match start
            .checked_add(buf.len())
            .filter(|&e| e <= s.current.len())
        {
            Some(end) => {
                buf.copy_from_slice(&s.current[start..end]);
                Ok(())
            }
            None => Err(Error::io(
                format!(
                    "{}: read of {} bytes at {offset} past the end",
                    self.name,
                    buf.len()
                ),
                io::Error::from(io::ErrorKind::UnexpectedEof),
            )),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.power.tick()?;
        let mut s = self.state.lock();
        let start = offset as usize;
        let end = start + buf.len();
        if s.current.len() < end {
            s.current.resize(end, 0);
        }
        s.current[start..end].copy_from_slice(buf);
        s.pending.push(Pending {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.power.tick()?;
        let mut s = self.state.lock();
        let pending = std::mem::take(&mut s.pending);
        for w in pending {
            let end = w.offset as usize + w.data.len();
            if s.durable.len() < end {
                s.durable.resize(end, 0);
            }
            s.durable[w.offset as usize..end].copy_from_slice(&w.data);
        }
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        self.power.check()?;
        Ok(self.state.lock().current.len() as u64)
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn capacity(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// The pages that hold a byte other than zero, as `MemBlockFile`'s: the
    /// tables a check reads because the file says they were written.
    fn data_ranges(&self, range: Range<u64>) -> Result<Option<Vec<Range<u64>>>> {
        self.power.check()?;
        Ok(Some(super::nonzero_pages(
            &self.state.lock().current,
            range,
        )))
    }

    /// A write of zeros, with a write's crash semantics: an operation the
    /// power switch counts (so a cut can land on it), seen by reads at
    /// once, and until the next sync kept, lost or torn by `crash_image`
    /// like any unsynced write. That is the adversary the engine must
    /// survive: it punches only blocks whose freeing is committed, so
    /// whether a crash keeps the old bytes, the zeros or a mix of both, no
    /// committed mapping reads them. Within the disk's length only (a
    /// punch never grows a file).
    fn punch(&self, offset: u64, len: u64) -> Result<()> {
        self.power.tick()?;
        let mut s = self.state.lock();
        let start = (offset as usize).min(s.current.len());
        let end = (offset.saturating_add(len) as usize).min(s.current.len());
        if start >= end {
            return Ok(());
        }
        s.current[start..end].fill(0);
        s.pending.push(Pending {
            offset: start as u64,
            data: vec![0; end - start],
        });
        Ok(())
    }

    /// Cut points are counted in program order: no I/O on helper threads.
    fn ordered_io(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        splitmix(seed)
    }

    #[test]
    fn synced_writes_always_survive_and_unsynced_ones_may_not() {
        let d = SimDisk::new(4096, "d", Arc::default());
        d.write_at(&[1; 100], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2; 100], 200).unwrap();
        let mut seen_kept = false;
        let mut seen_lost = false;
        for seed in 1..64 {
            let img = d.crash_image(&mut rng(seed), false);
            assert_eq!(&img[..100], &[1; 100]);
            match img[200] {
                2 => seen_kept = true,
                0 => seen_lost = true,
                other => panic!("unexpected byte {other}"),
            }
        }
        assert!(seen_kept && seen_lost);
    }

    #[test]
    fn torn_writes_keep_whole_sectors_only() {
        let d = SimDisk::new(8192, "d", Arc::default());
        d.write_at(&[9; 4096], 1024).unwrap();
        let mut torn = false;
        for seed in 1..200 {
            let img = d.crash_image(&mut rng(seed), true);
            for sector in img[1024..5120].chunks(SECTOR) {
                assert!(sector.iter().all(|&b| b == 9) || sector.iter().all(|&b| b == 0));
            }
            let kept = img[1024..5120].chunks(SECTOR).filter(|s| s[0] == 9).count();
            torn |= kept > 0 && kept < 8;
        }
        assert!(torn, "some crash images tear the write");
    }

    #[test]
    fn the_power_switch_fails_everything_from_the_cut_on() {
        let power = PowerSwitch::cutting_at(2);
        let d = SimDisk::new(4096, "d", power.clone());
        d.write_at(&[1], 0).unwrap();
        d.sync().unwrap();
        assert!(d.write_at(&[2], 1).is_err());
        assert!(power.is_cut());
        let mut b = [0u8; 1];
        assert!(d.read_at(&mut b, 0).is_err());
        assert!(d.sync().is_err());
        assert_eq!(d.crash_image(&mut rng(1), false)[0], 1);
    }

    #[test]
    fn a_punch_reads_as_zeros_and_an_unsynced_one_may_be_lost() {
        let d = SimDisk::new(8192, "d", Arc::default());
        d.write_at(&[7; 8192], 0).unwrap();
        d.sync().unwrap();
        d.punch(4096, 8192).unwrap();
        assert_eq!(d.len().unwrap(), 8192, "a punch never grows the disk");
        let mut b = [1u8; 4096];
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0; 4096]);
        let (mut kept, mut lost) = (false, false);
        for seed in 1..64 {
            let img = d.crash_image(&mut rng(seed), false);
            assert_eq!(&img[..4096], &[7; 4096][..], "outside the punch");
            kept |= img[4096] == 0;
            lost |= img[4096] == 7;
        }
        assert!(kept && lost);
        d.sync().unwrap();
        assert_eq!(d.crash_image(&mut rng(1), true)[4096..], [0; 4096]);
    }

    #[test]
    fn writes_past_the_end_grow_the_disk() {
        let d = SimDisk::new(0, "d", Arc::default());
        d.write_at(&[5; 10], 100).unwrap();
        assert_eq!(d.len().unwrap(), 110);
        d.sync().unwrap();
        assert_eq!(d.crash_image(&mut rng(3), false).len(), 110);
    }
}
