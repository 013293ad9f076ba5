//! A device's fixed geometry and choices, recorded at create time in the
//! superblock and checked on every open.

use serde::Serialize;

use crate::compress::Compression;
use crate::error::{Error, Result};
use crate::fingerprint::HashAlgo;
use crate::kinds::{self, PlacementKind};
use crate::size::format_size;

pub const MIN_CHUNK_SIZE: u32 = 4096;
pub const MAX_CHUNK_SIZE: u32 = 1 << 20;
pub const DEFAULT_CHUNK_SIZE: u32 = 4096;
/// Where PBN 0 starts on the data device; the bytes before hold the data header.
pub const DATA_OFFSET: u64 = 4096;

/// Logical block number: index of a chunk in the device as clients see it.
pub type Lbn = u64;
/// Physical block number: the address of a stored chunk, as the metadata
/// store counts it (one per data block, or per fragment slot when packing).
pub type Pbn = u64;
/// Addresses per data block on a packing device: 14 fragment slots, one
/// unused, one for a chunk stored raw (see `placement::packed`).
pub const ADDRESSES_PER_BLOCK: u64 = 16;
/// The slot of a chunk stored raw, alone in its block.
pub const RAW_SLOT: u64 = 15;
/// Fragment slots a packed block has at most (`pack::MAX_SLOTS`).
const FRAGMENT_SLOTS: u64 = 14;

/// How a packing device turns (block, slot) into the address its store
/// counts and maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// `block * 16 + slot`, a raw chunk at slot 15: the packing layout of
    /// the Dmdedup stores. A store whose tables are arrays by address pays
    /// for all 16 slots of every block.
    Slots,
    /// A raw chunk at its block number; fragments after every block, at
    /// `blocks + block * 14 + slot`: the sparse store's layout, whose
    /// arrays by address then stay dense for data that does not compress.
    DenseRaw { blocks: u64 },
}

impl Addressing {
    pub fn addr(self, block: u64, slot: u64) -> Pbn {
        match self {
            Addressing::Slots => block * ADDRESSES_PER_BLOCK + slot,
            Addressing::DenseRaw { .. } if slot == RAW_SLOT => block,
            Addressing::DenseRaw { blocks } => blocks + block * FRAGMENT_SLOTS + slot,
        }
    }

    /// (block, slot) of an address; an address no block has gives a block
    /// beyond the device, or a fragment slot past the last.
    pub fn split(self, pbn: Pbn) -> (u64, u64) {
        match self {
            Addressing::Slots => (pbn / ADDRESSES_PER_BLOCK, pbn % ADDRESSES_PER_BLOCK),
            Addressing::DenseRaw { blocks } if pbn < blocks => (pbn, RAW_SLOT),
            Addressing::DenseRaw { blocks } => {
                let f = pbn - blocks;
                (f / FRAGMENT_SLOTS, f % FRAGMENT_SLOTS)
            }
        }
    }

    /// Addresses for `blocks` data blocks.
    pub fn space(self, blocks: u64) -> u64 {
        match self {
            Addressing::Slots => blocks * ADDRESSES_PER_BLOCK,
            Addressing::DenseRaw { .. } => blocks * (1 + FRAGMENT_SLOTS),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceConfig {
    /// Ties the data and metadata devices together; a mismatch means foreign files.
    #[serde(serialize_with = "serialize_uuid")]
    pub uuid: [u8; 16],
    pub backend: String,
    pub chunk_size: u32,
    pub hash: HashAlgo,
    /// Compare bytes on a fingerprint hit before sharing a chunk.
    pub verify: bool,
    /// Size clients see, in bytes (a multiple of `chunk_size`).
    pub logical_size: u64,
    /// Chunk slots (blocks of `chunk_size`) on the data device.
    pub physical_chunks: u64,
    /// How new chunks are compressed before they are stored.
    pub compression: Compression,
}

fn serialize_uuid<S: serde::Serializer>(
    uuid: &[u8; 16],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&uuid::Uuid::from_bytes(*uuid).to_string())
}

impl DeviceConfig {
    pub fn logical_chunks(&self) -> u64 {
        self.logical_size / self.chunk_size as u64
    }

    pub fn physical_size(&self) -> u64 {
        self.physical_chunks * self.chunk_size as u64
    }

    /// How the device places chunks on the data device (the registry's
    /// table decides, from the backend's name and the compression).
    pub fn placement(&self) -> PlacementKind {
        match kinds::kind(&self.backend) {
            Some(k) if k.placement == PlacementKind::Thin => PlacementKind::Thin,
            _ if !self.compression.is_none() => PlacementKind::Packed,
            _ => PlacementKind::Plain,
        }
    }

    /// Whether compressed chunks are packed several to a block.
    pub fn packs(&self) -> bool {
        self.placement() == PlacementKind::Packed
    }

    /// How a packing device addresses its blocks' slots: the registry's
    /// table says, by the metadata store.
    pub fn addressing(&self) -> Addressing {
        match kinds::kind(&self.backend) {
            Some(k) if k.store == kinds::StoreKind::Sparse => Addressing::DenseRaw {
                blocks: self.physical_chunks,
            },
            _ => Addressing::Slots,
        }
    }

    /// Addresses the metadata store's PBNs range over. On a packing device
    /// a PBN names a block and a slot in it (see `Addressing`); otherwise
    /// one per block.
    pub fn pbn_space(&self) -> u64 {
        if self.packs() {
            self.addressing().space(self.physical_chunks)
        } else {
            self.physical_chunks
        }
    }

    /// Most distinct chunks the device stores, which is what hash indexes
    /// are sized for: one per block, or on a packing device as many as
    /// the codec is expected to fit (more are refused with ENOSPC).
    pub fn max_chunks(&self) -> u64 {
        if self.packs() {
            let per_block = match self.compression {
                Compression::Zstd(_) => 8,
                _ => 4,
            };
            self.physical_chunks * per_block
        } else {
            self.physical_chunks
        }
    }

    /// Bytes the data device must hold.
    pub fn data_device_len(&self) -> u64 {
        DATA_OFFSET + self.physical_size()
    }

    /// Byte offset of a PBN on the data device.
    pub fn pbn_offset(&self, pbn: Pbn) -> u64 {
        DATA_OFFSET + pbn * self.chunk_size as u64
    }

    /// The PBN (a block, for packing) at a chunk-aligned byte offset of the
    /// data device: the inverse of `pbn_offset`.
    pub fn pbn_at(&self, offset: u64) -> Pbn {
        (offset - DATA_OFFSET) / self.chunk_size as u64
    }

    pub fn uuid_string(&self) -> String {
        uuid::Uuid::from_bytes(self.uuid).to_string()
    }

    /// Check everything a superblock or a user could get wrong.
    pub fn validate(&self) -> Result<()> {
        validate_chunk_size(self.chunk_size)?;
        let chunk = self.chunk_size as u64;
        if self.logical_size == 0 {
            return Err(Error::InvalidArgument(
                "the device size must be greater than zero (e.g. --size 10G)".into(),
            ));
        }
        if self.logical_size % chunk != 0 {
            return Err(Error::InvalidArgument(format!(
                "the device size {} ({}) is not a multiple of the chunk size {}; try {}",
                self.logical_size,
                format_size(self.logical_size),
                format_size(chunk),
                self.logical_size / chunk * chunk + chunk
            )));
        }
        if matches!(self.compression, Compression::Zstd(_))
            && self.placement() == PlacementKind::Thin
        {
            return Err(Error::InvalidArgument(format!(
                "the {} backend compresses each chunk with LZ4 into a C-block that carries window metadata (ThinDedup), so it takes --compression lz4 or none, not {}",
                self.backend, self.compression
            )));
        }
        if self.packs() && chunk > crate::pack::MAX_BLOCK as u64 {
            return Err(Error::InvalidArgument(format!(
                "compressed chunks are packed into blocks of at most {}, and this device's chunks are {}: give --compression none or a smaller --chunk-size",
                format_size(crate::pack::MAX_BLOCK as u64),
                format_size(chunk)
            )));
        }
        if self.physical_chunks == 0 {
            return Err(Error::InvalidArgument(format!(
                "the data device holds no chunk of {}; give a --physical-size of at least one chunk",
                format_size(chunk)
            )));
        }
        // Keep every byte offset computable without overflow, with room for
        // the sentinel values the backends reserve at the top of the range.
        // (Checked before any multiplication: a superblock may claim anything.)
        let limit = 1u64 << 56;
        if self.logical_size > limit || self.physical_chunks > limit / chunk {
            return Err(Error::InvalidArgument(format!(
                "sizes above {} are not supported",
                format_size(limit)
            )));
        }
        Ok(())
    }
}

pub fn validate_chunk_size(chunk_size: u32) -> Result<()> {
    if !chunk_size.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
        return Err(Error::InvalidArgument(format!(
            "chunk size {chunk_size} is not allowed: it must be a power of two from 4K to 1M (e.g. --chunk-size 4K)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_addressings_round_trip_and_stay_in_their_space() {
        for a in [Addressing::Slots, Addressing::DenseRaw { blocks: 1000 }] {
            let space = a.space(1000);
            for block in [0, 1, 499, 999] {
                for slot in (0..14).chain([RAW_SLOT]) {
                    let p = a.addr(block, slot);
                    assert!(p < space, "{a:?} ({block}, {slot}) -> {p}");
                    assert_eq!(a.split(p), (block, slot), "{a:?}");
                }
            }
        }
        // Raw chunks are dense in the sparse layout.
        let a = Addressing::DenseRaw { blocks: 1000 };
        assert_eq!(a.addr(7, RAW_SLOT), 7);
        assert_eq!(a.split(1000), (0, 0));
    }

    use super::*;

    fn cfg() -> DeviceConfig {
        DeviceConfig {
            uuid: [7; 16],
            backend: "inram".into(),
            chunk_size: 4096,
            hash: HashAlgo::Blake3,
            verify: false,
            logical_size: 1 << 20,
            physical_chunks: 128,
            compression: Compression::None,
        }
    }

    #[test]
    fn accepts_a_sane_geometry() {
        cfg().validate().unwrap();
    }

    #[test]
    fn rejects_sizes_whose_byte_offsets_would_overflow() {
        let mut c = cfg();
        c.physical_chunks = (1 << 62) + 1;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        c.physical_chunks = u64::MAX;
        assert!(c.validate().is_err());
    }

    #[test]
    fn rejects_bad_chunk_sizes_and_unaligned_sizes() {
        for c in [0, 512, 2048, 4097, 6144, 2 << 20] {
            let mut c2 = cfg();
            c2.chunk_size = c;
            assert!(c2.validate().is_err(), "chunk size {c}");
        }
        let mut c = cfg();
        c.logical_size += 1;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("not a multiple of the chunk size"), "{msg}");
        let mut c = cfg();
        c.physical_chunks = 0;
        assert!(c.validate().is_err());
    }
}
