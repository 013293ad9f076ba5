//! `ContainerWriter`: gathers segments, compressed, until the container
//! reaches its target size (16 MiB by default, as in the paper, §3.1: the
//! unit of all container I/O), then seals them into the bytes of one
//! container object.
//!
//! The writer does not deduplicate: whether a segment is new is the index's
//! question, asked before `add`.

use dedup_core::compress::Compression;
use dedup_core::fingerprint::{Fingerprint, HashAlgo};

use crate::error::{Error, Result};
use crate::format::{
    crc, Entry, Header, Location, Trailer, ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, MAX_SEGMENT_LEN,
    TRAILER_LEN,
};

/// A container's default target size.
pub const DEFAULT_TARGET: usize = 16 << 20;

/// The one fingerprint the format records (a new algorithm is a new version).
pub const HASH: HashAlgo = HashAlgo::Blake3;

pub struct ContainerWriter {
    id: u64,
    target: usize,
    compression: Compression,
    /// Header space, then the stored segments back to back.
    body: Vec<u8>,
    entries: Vec<Entry>,
}

impl ContainerWriter {
    /// A writer for container `id`: 16 MiB target, LZ4.
    pub fn new(id: u64) -> ContainerWriter {
        ContainerWriter::with_options(id, DEFAULT_TARGET, Compression::Lz4)
    }

    pub fn with_options(id: u64, target: usize, compression: Compression) -> ContainerWriter {
        ContainerWriter {
            id,
            target,
            compression,
            body: vec![0u8; HEADER_LEN],
            entries: Vec::new(),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The catalog entries of the segments added so far.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn segment_count(&self) -> usize {
        self.entries.len()
    }

    /// The size the container would have if sealed now.
    pub fn sealed_len(&self) -> usize {
        self.body.len() + self.entries.len() * ENTRY_LEN + TRAILER_LEN
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
        let compressed = self.compression.compress(data);
        let (compression, stored) = match &compressed {
            Some(c) => (self.compression, c.as_slice()),
            None => (Compression::None, data),
        };
        let location = Location {
            offset: self.body.len() as u64,
            stored_len: stored.len() as u32,
            raw_len: data.len() as u32,
            compression,
            stored_crc: crc(stored),
        };
        self.body.extend_from_slice(stored);
        self.entries.push(Entry {
            fingerprint,
            location,
        });
        Ok((fingerprint, self.entries.len() - 1))
    }

    /// The container's bytes: header, segments, catalog, trailer.
    pub fn seal(self) -> Vec<u8> {
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
        for entry in &self.entries {
            out.extend_from_slice(&entry.encode());
        }
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
