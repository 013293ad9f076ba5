//! `ContainerWriter`: gathers segments, compressed in frames, until the container
//! reaches its target size (16 MiB by default, as in the paper, §3.1: the
//! unit of all container I/O), then seals them into the bytes of one
//! container object.
//!
//! The writer does not deduplicate: whether a segment is new is the index's
//! question, asked before `add`.

use std::collections::VecDeque;
use std::sync::mpsc;

use dedup_common::compress::{Compression, ZstdTuning};
use dedup_common::fingerprint::{Fingerprint, HashAlgo};

use crate::catalog_bytes;
use crate::error::{Error, Result};
use crate::format::{
    crc, Entry, Header, Location, Trailer, ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, MAX_FRAME_LEN,
    MAX_SEGMENT_LEN, TRAILER_LEN,
};

/// A container's default target size.
pub const DEFAULT_TARGET: usize = 16 << 20;

/// The most a writer reserves for a container's body up front (a larger
/// target grows as it fills).
const MAX_PRESIZE: usize = 64 << 20;

/// The one fingerprint the format records (a new algorithm is a new version).
pub const HASH: HashAlgo = HashAlgo::Blake3;

/// How many raw bytes a frame gathers before it is compressed: zstd keeps
/// finding matches up to about a megabyte (on a 2 GiB ext4 image, frames of
/// 4 KiB, 64 KiB, 256 KiB and 1 MiB stored 864, 708, 663 and 639 MB at
/// level 3), lz4 gains little past 128 KiB (903 MB at 64 KiB, 882 at
/// 256 KiB). Uncompressed segments are a frame each, so reading one reads
/// only it.
pub fn frame_target(compression: Compression) -> usize {
    match compression {
        Compression::None => 0,
        Compression::Lz4 => 128 << 10,
        Compression::Zstd(_) => 1 << 20,
    }
}

/// zstd's parameters for a frame past its level. At level 1 (the store's
/// default), zstd looks for matches of 7 bytes and more in a frame this
/// large; from 6 on, the first GiB of the bench's ext4 image stored 325.2
/// MB instead of 332.3 (2.1 % less) in 1.47 s instead of 1.45, and 5 stored
/// 321.4 MB in 1.56 s. Other levels keep zstd's choice (not measured).
pub fn frame_tuning(compression: Compression) -> ZstdTuning {
    match compression {
        Compression::Zstd(1) => ZstdTuning { min_match: Some(6) },
        _ => ZstdTuning::default(),
    }
}

/// A frame's room: its target and a segment of up to 64 KiB past it (a
/// larger one grows it); none for a frame of one segment (no compression),
/// which takes that segment's size.
fn frame_room(frame_target: usize) -> usize {
    match frame_target {
        0 => 0,
        t => t + (64 << 10),
    }
}

/// Frames a writer has compressing at once, at most: enough to keep every
/// core busy while the backup goes on cutting and hashing.
fn max_in_flight() -> usize {
    2 * rayon::current_num_threads()
}

/// A closed frame being compressed on the thread pool.
struct InFlight {
    /// Its entries: `entries[first..end]`.
    first: usize,
    end: usize,
    raw_len: usize,
    done: mpsc::Receiver<Compressed>,
}

/// A frame's compression, stored bytes and their CRC (computed on the
/// pool too: it was 1.5 % of a backup's CPU on the thread that set its
/// pace).
type Compressed = (Compression, Vec<u8>, u32);

/// Adding, sealing and closing frames may wait for frames compressing on
/// the rayon pool: not for use on a pool thread (its own jobs could then
/// queue behind it).
pub struct ContainerWriter {
    id: u64,
    target: usize,
    compression: Compression,
    frame_target: usize,
    /// Header space, then the stored frames back to back.
    body: Vec<u8>,
    /// Closed frames in order, compressing; appended to `body` as they
    /// finish, oldest first, so frames stay in catalog order.
    in_flight: VecDeque<InFlight>,
    in_flight_raw: usize,
    /// The open frame's raw bytes: the segments of `entries[frame_first..]`.
    frame: Vec<u8>,
    frame_first: usize,
    /// Entries of frames not yet in `body` have only `raw_len` and
    /// `frame_at` set.
    entries: Vec<Entry>,
}

impl ContainerWriter {
    /// A writer for container `id`: 16 MiB target, LZ4.
    pub fn new(id: u64) -> ContainerWriter {
        ContainerWriter::with_options(id, DEFAULT_TARGET, Compression::Lz4)
    }

    pub fn with_options(id: u64, target: usize, compression: Compression) -> ContainerWriter {
        // Several frames to a container, however small it is set.
        let frame_target = frame_target(compression).min(target / 4);
        // Room for a full container (and the frame that fills it), so it
        // is never copied to grow.
        let mut body = Vec::with_capacity(target.min(MAX_PRESIZE) + frame_room(frame_target));
        body.resize(HEADER_LEN, 0);
        ContainerWriter {
            id,
            target,
            compression,
            frame_target,
            body,
            in_flight: VecDeque::new(),
            in_flight_raw: 0,
            frame: Vec::new(),
            frame_first: 0,
            entries: Vec::new(),
        }
    }

    /// Close frames at `raw` bytes instead (0: a frame per segment; at
    /// most `MAX_FRAME_LEN`, which readers enforce).
    pub fn with_frame_target(mut self, raw: usize) -> ContainerWriter {
        self.frame_target = raw.min(MAX_FRAME_LEN);
        self
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The catalog entries of the segments added so far (those of the
    /// open frame know only their raw length until it is closed).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn segment_count(&self) -> usize {
        self.entries.len()
    }

    /// The size the container would have if sealed now, counting frames
    /// not yet compressed raw (at most that).
    pub fn sealed_len(&self) -> usize {
        self.body.len()
            + self.in_flight_raw
            + self.frame.len()
            + self.entries.len() * ENTRY_LEN
            + TRAILER_LEN
    }

    /// Full: at or past the target. An empty writer is never full, so a
    /// segment larger than the target still gets a container of its own.
    pub fn is_full(&self) -> bool {
        !self.entries.is_empty() && self.sealed_len() >= self.target
    }

    /// Add a segment; returns its fingerprint and its index in the
    /// container. Refused when full (seal and start another) or when the
    /// segment is over `MAX_SEGMENT_LEN`.
    pub fn add(&mut self, data: &[u8]) -> Result<(Fingerprint, usize)> {
        self.add_hashed(data, HASH.fingerprint(data))
    }

    /// `add` for a segment whose fingerprint the caller computed (with
    /// `HASH`) from these very bytes: hashing is the dearest step of a
    /// backup, so it is done once.
    pub fn add_hashed(
        &mut self,
        data: &[u8],
        fingerprint: Fingerprint,
    ) -> Result<(Fingerprint, usize)> {
        if data.len() > MAX_SEGMENT_LEN {
            return Err(Error::InvalidArgument(format!(
                "a {}-byte segment is over the {MAX_SEGMENT_LEN}-byte limit of a container segment",
                data.len()
            )));
        }
        if self.is_full() {
            return Err(Error::InvalidArgument(format!(
                "container {} is full ({} bytes of a {}-byte target): seal it first",
                self.id,
                self.sealed_len(),
                self.target
            )));
        }
        if !self.frame.is_empty() && self.frame.len() + data.len() > self.frame_target {
            self.close_frame();
        }
        self.entries.push(Entry {
            fingerprint,
            location: Location {
                offset: 0,
                stored_len: 0,
                raw_len: data.len() as u32,
                compression: Compression::None,
                stored_crc: 0,
                frame_at: self.frame.len() as u32,
                frame_len: 0,
            },
        });
        self.frame.extend_from_slice(data);
        if self.frame.len() >= self.frame_target {
            self.close_frame();
        }
        Ok((fingerprint, self.entries.len() - 1))
    }

    /// Add an entry for a segment whose bytes are gone (compaction keeps
    /// entry numbers, see `Entry::is_absent`).
    pub fn add_absent(&mut self, entry: &Entry) {
        self.close_frame();
        self.finish_all();
        self.entries.push(entry.absent_at(self.body.len() as u64));
        self.frame_first = self.entries.len();
    }

    /// Close the open frame: compress it on the thread pool (the dearest
    /// step of a backup of new data, so it runs beside the hashing).
    fn close_frame(&mut self) {
        if self.frame_first == self.entries.len() {
            return;
        }
        if self.in_flight.len() >= max_in_flight() {
            self.finish_oldest();
        }
        // The next frame's room at once: a frame grown by doubling was
        // copied about once more on its way to a megabyte.
        let room = frame_room(self.frame_target);
        let frame = std::mem::replace(&mut self.frame, Vec::with_capacity(room));
        let (tx, rx) = mpsc::sync_channel(1);
        let compression = self.compression;
        let raw_len = frame.len();
        rayon::spawn(move || {
            let (compression, stored) =
                match compression.compress_tuned(&frame, frame_tuning(compression)) {
                    Some(c) => (compression, c),
                    None => (Compression::None, frame),
                };
            let stored_crc = crc(&stored);
            let compressed = (compression, stored, stored_crc);
            let _ = tx.send(compressed); // the writer may be gone: dropped
        });
        self.in_flight.push_back(InFlight {
            first: self.frame_first,
            end: self.entries.len(),
            raw_len,
            done: rx,
        });
        self.in_flight_raw += raw_len;
        self.frame_first = self.entries.len();
    }

    /// Wait for the oldest frame in flight and append it to the body.
    fn finish_oldest(&mut self) {
        let Some(f) = self.in_flight.pop_front() else {
            return;
        };
        // The pool thread sends unless compressing panicked; a panic is a
        // bug, not bad input, and is passed on.
        let (compression, stored, stored_crc) = f
            .done
            .recv()
            .expect("a frame's compression finished without an answer (it panicked)");
        self.in_flight_raw -= f.raw_len;
        let (offset, stored_len) = (self.body.len() as u64, stored.len() as u32);
        for entry in &mut self.entries[f.first..f.end] {
            let l = &mut entry.location;
            l.offset = offset;
            l.stored_len = stored_len;
            l.compression = compression;
            l.stored_crc = stored_crc;
            l.frame_len = f.raw_len as u32;
        }
        self.body.extend_from_slice(&stored);
    }

    fn finish_all(&mut self) {
        while !self.in_flight.is_empty() {
            self.finish_oldest();
        }
    }

    /// The container's bytes: header, frames, catalog, trailer.
    pub fn seal(mut self) -> Vec<u8> {
        self.close_frame();
        self.finish_all();
        let count = self.entries.len() as u32;
        let mut out = self.body;
        let header = Header {
            version: FORMAT_VERSION,
            flags: 0,
            container_id: self.id,
            segment_count: count,
        };
        out[..HEADER_LEN].copy_from_slice(&header.encode());
        let catalog_offset = out.len() as u64;
        out.extend_from_slice(&catalog_bytes::pack(&self.entries, FORMAT_VERSION));
        let catalog = &out[catalog_offset as usize..];
        let trailer = Trailer {
            version: FORMAT_VERSION,
            segment_count: count,
            container_id: self.id,
            catalog_offset,
            catalog_len: catalog.len() as u64,
            catalog_crc: crc(catalog),
        };
        out.extend_from_slice(&trailer.encode());
        out
    }
}
