//! redb's storage: a growable region of the metadata device, after our
//! superblock, whose length is kept in a two-slot length record. redb relies
//! on file-length semantics (a resize happens whole or not at all, and new
//! space reads as zeros), so a resize zero-fills new space, then writes the
//! new length to the record slot not holding the current one, and syncs.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::MetaIoStats;
use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::error::{Error, Result};
use crate::superblock::SUPERBLOCK_AREA;

const RECORD_MAGIC: &[u8; 8] = b"DDUPRLEN";
const RECORD_SIZE: u64 = 4096;
/// Where redb's bytes start on the metadata device.
pub const REGION_START: u64 = SUPERBLOCK_AREA + 2 * RECORD_SIZE;
const ZERO_FILL: usize = 1 << 20;

/// Metadata-device I/O counters, shared with the backend for `dedup status`.
#[derive(Default, Debug)]
pub struct IoCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub syncs: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl IoCounters {
    pub fn snapshot(&self) -> MetaIoStats {
        MetaIoStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            ..MetaIoStats::default()
        }
    }
}

struct LenState {
    len: u64,
    generation: u64,
}

pub struct Region {
    file: Arc<dyn BlockFile>,
    state: Mutex<LenState>,
    io: Arc<IoCounters>,
    /// Largest length the device can hold (block devices cannot grow).
    capacity: Option<u64>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Region({}, len {})",
            self.file.describe(),
            self.state.lock().len
        )
    }
}

fn encode_record(len: u64, generation: u64) -> Vec<u8> {
    let mut e = Encoder::with_capacity(RECORD_SIZE as usize);
    e.bytes(RECORD_MAGIC)
        .u64(generation)
        .u64(len)
        .pad_to(RECORD_SIZE as usize);
    let mut b = e.buf;
    seal(&mut b);
    b
}

fn decode_record(block: &[u8]) -> Option<(u64, u64)> {
    if &block[..8] != RECORD_MAGIC || !is_sealed(block) {
        return None;
    }
    let mut d = Decoder::new(&block[8..], "cowbtree length record");
    let generation = d.u64().ok()?;
    let len = d.u64().ok()?;
    Some((len, generation))
}

impl Region {
    /// A new, empty region: writes a zero-length record.
    pub fn create(
        file: Arc<dyn BlockFile>,
        io: Arc<IoCounters>,
        capacity: Option<u64>,
    ) -> Result<Region> {
        let r = Region {
            file,
            state: Mutex::new(LenState {
                len: 0,
                generation: 0,
            }),
            io,
            capacity,
        };
        r.file
            .write_at(&[0u8; 2 * RECORD_SIZE as usize], SUPERBLOCK_AREA)?;
        r.persist_len(&mut r.state.lock(), 0)?;
        Ok(r)
    }

    /// The region as the newest valid length record describes it.
    pub fn open(
        file: Arc<dyn BlockFile>,
        io: Arc<IoCounters>,
        capacity: Option<u64>,
    ) -> Result<Region> {
        let mut best: Option<(u64, u64)> = None;
        for slot in 0..2 {
            let mut block = vec![0u8; RECORD_SIZE as usize];
            file.read_at(&mut block, SUPERBLOCK_AREA + slot * RECORD_SIZE)?;
            if let Some((len, generation)) = decode_record(&block) {
                if best.is_none_or(|(_, g)| generation > g) {
                    best = Some((len, generation));
                }
            }
        }
        let (len, generation) =
            best.ok_or_else(|| Error::corrupt("cowbtree length record", "neither slot is valid"))?;
        let available = file.len()?.saturating_sub(REGION_START);
        if len > available {
            return Err(Error::corrupt(
                "cowbtree length record",
                format!("records {len} bytes of B-tree but the metadata device holds {available}"),
            ));
        }
        Ok(Region {
            file,
            state: Mutex::new(LenState { len, generation }),
            io,
            capacity,
        })
    }

    fn persist_len(&self, s: &mut LenState, len: u64) -> Result<()> {
        let generation = s.generation + 1;
        let slot = generation % 2;
        self.file.write_at(
            &encode_record(len, generation),
            SUPERBLOCK_AREA + slot * RECORD_SIZE,
        )?;
        self.file.sync()?;
        self.io.writes.fetch_add(1, Ordering::Relaxed);
        self.io.syncs.fetch_add(1, Ordering::Relaxed);
        self.io
            .bytes_written
            .fetch_add(RECORD_SIZE, Ordering::Relaxed);
        s.len = len;
        s.generation = generation;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.state.lock().len
    }
}

fn io_err(e: Error) -> io::Error {
    match e {
        Error::Io { cause, .. } => cause,
        other => io::Error::other(other.to_string()),
    }
}

impl redb::StorageBackend for Region {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let len = self.state.lock().len;
        if offset + out.len() as u64 > len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the B-tree region",
            ));
        }
        self.io.reads.fetch_add(1, Ordering::Relaxed);
        self.io
            .bytes_read
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.file
            .read_at(out, REGION_START + offset)
            .map_err(io_err)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        if let Some(cap) = self.capacity {
            if len > cap {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("the B-tree needs {len} bytes but the metadata device holds {cap}"),
                ));
            }
        }
        // New space must read as zeros, and be zeros before the length says so.
        let zeros = vec![0u8; ZERO_FILL];
        let mut at = s.len;
        while at < len {
            let n = ((len - at) as usize).min(ZERO_FILL);
            self.file
                .write_at(&zeros[..n], REGION_START + at)
                .map_err(io_err)?;
            self.io.writes.fetch_add(1, Ordering::Relaxed);
            self.io.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
            at += n as u64;
        }
        if len > s.len {
            // The zeros must be durable before the length that exposes them.
            self.file.sync().map_err(io_err)?;
            self.io.syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.persist_len(&mut s, len).map_err(io_err)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.io.syncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync().map_err(io_err)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let len = self.state.lock().len;
        if offset + data.len() as u64 > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "write past the end of the B-tree region",
            ));
        }
        self.io.writes.fetch_add(1, Ordering::Relaxed);
        self.io
            .bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.file
            .write_at(data, REGION_START + offset)
            .map_err(io_err)
    }
}
