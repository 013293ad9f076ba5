//! Where disktable keeps what on the metadata device.
//!
//! ```text
//! 0        superblock slots (8 KiB)
//! 8 KiB    journal: journal_blocks blocks of 4 KiB (room for every table block)
//! T        table blocks: root, LBN array, refcount array, hash table slots
//! ```
//! Every table block is 4 KiB: an 8-byte header (crc32c of the block number
//! and payload, 4 reserved bytes) and a 4088-byte payload. A block of all
//! zeros is a valid, never-written block.

use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::Error;
use crate::superblock::SUPERBLOCK_AREA;

pub const BLOCK: usize = 4096;
pub const HEADER: usize = 8;
pub const PAYLOAD: usize = BLOCK - HEADER;
pub const LBNS_PER_BLOCK: u64 = (PAYLOAD / 8) as u64;
pub const REFS_PER_BLOCK: u64 = (PAYLOAD / 4) as u64;
pub const SLOT_BYTES: usize = 40;
pub const SLOTS_PER_BLOCK: u64 = (PAYLOAD / SLOT_BYTES) as u64;
/// Block numbers per journal descriptor block.
pub const DESC_ENTRIES: u64 = (BLOCK / 8) as u64;

/// Where a journaled table store keeps its journal and its table blocks
/// on the metadata device: all that the buffer cache and the journal need
/// to know (disktable's and sparse's layouts both give one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    pub journal_start: u64,
    pub journal_blocks: u64,
    pub table_start: u64,
    pub table_blocks: u64,
    /// (first block, name) of each table, in block order, for messages.
    /// Every layout starts with the root (block 0) and the LBN map.
    pub names: [(u64, &'static str); 6],
}

/// The table block holding the store's state record: `check --repair`
/// cannot rebuild it (the superblock and the journal are its only
/// safeguards), so it is never read as empty.
pub const ROOT: u64 = 0;

/// Where the root block keeps the number of the commit that wrote it
/// (zero in roots written before it was kept: state records are far
/// shorter than the block).
pub const COMMIT_AT: usize = BLOCK - 8;

impl Area {
    /// Which table a block belongs to, for error messages.
    pub fn table_name(&self, block: u64) -> &'static str {
        self.names
            .iter()
            .rev()
            .find(|(first, name)| block >= *first && !name.is_empty())
            .map_or("table", |(_, name)| name)
    }

    /// Whether `block` is in the LBN map, the one table whose contents
    /// cannot be derived from the others.
    pub fn in_lbn_map(&self, block: u64) -> bool {
        (self.names[1].0..self.names[2].0).contains(&block)
    }

    /// The error for a table block that fails its checksum: the table, the
    /// block, and what `check --repair` does about it.
    pub fn damaged(&self, block: u64) -> Error {
        let fix = if block == ROOT {
            "it holds the last commit's state record, which nothing can rebuild: put back a copy of the metadata"
        } else if self.in_lbn_map(block) {
            "the mappings it holds are lost; `dedup check --repair DIR` (device stopped) unmaps \
             those LBNs, names them, and keeps the rest of the device"
        } else {
            "`dedup check --repair DIR` (device stopped) rebuilds what it held from the LBN map \
             and the data"
        };
        Error::corrupt(
            self.table_name(block),
            format!("block {block} fails its checksum; {fix}"),
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Addresses the refcount array covers (`DeviceConfig::pbn_space`,
    /// kept here because the write path checks every PBN against it).
    pub pbn_space: u64,
    pub journal_blocks: u64,
    pub lbn_blocks: u64,
    pub ref_blocks: u64,
    pub hash_slots: u64,
    pub hash_blocks: u64,
}

impl Geometry {
    pub fn new(cfg: &DeviceConfig) -> Geometry {
        let lbn_blocks = cfg.logical_chunks().div_ceil(LBNS_PER_BLOCK);
        let pbn_space = cfg.pbn_space();
        let ref_blocks = pbn_space.div_ceil(REFS_PER_BLOCK);
        let hash_slots = crate::backends::probe::slots_for(cfg.max_chunks());
        let hash_blocks = hash_slots.div_ceil(SLOTS_PER_BLOCK);
        let tables = 1 + lbn_blocks + ref_blocks + hash_blocks;
        // Big enough for every table block at once: a transaction can then
        // never outgrow it, however much a GC pass or a repair changes
        // (this doubles the metadata device, to about 2.8 % of the data).
        let journal_blocks = 1 + tables.div_ceil(DESC_ENTRIES) + tables;
        Geometry {
            pbn_space,
            journal_blocks,
            lbn_blocks,
            ref_blocks,
            hash_slots,
            hash_blocks,
        }
    }

    pub fn journal_start(&self) -> u64 {
        SUPERBLOCK_AREA
    }

    pub fn table_start(&self) -> u64 {
        SUPERBLOCK_AREA + self.journal_blocks * BLOCK as u64
    }

    pub fn table_blocks(&self) -> u64 {
        1 + self.lbn_blocks + self.ref_blocks + self.hash_blocks
    }

    /// Bytes the metadata device must hold.
    pub fn device_len(&self) -> u64 {
        self.table_start() + self.table_blocks() * BLOCK as u64
    }

    /// (table block, byte offset in its payload) of an LBN's entry.
    pub fn lbn(&self, lbn: Lbn) -> (u64, usize) {
        (
            1 + lbn / LBNS_PER_BLOCK,
            (lbn % LBNS_PER_BLOCK) as usize * 8,
        )
    }

    pub fn refcount(&self, pbn: Pbn) -> (u64, usize) {
        (
            1 + self.lbn_blocks + pbn / REFS_PER_BLOCK,
            (pbn % REFS_PER_BLOCK) as usize * 4,
        )
    }

    pub fn slot(&self, slot: u64) -> (u64, usize) {
        (
            1 + self.lbn_blocks + self.ref_blocks + slot / SLOTS_PER_BLOCK,
            (slot % SLOTS_PER_BLOCK) as usize * SLOT_BYTES,
        )
    }

    /// Which table a block belongs to, for error messages.
    pub fn table_name(&self, block: u64) -> &'static str {
        self.area().table_name(block)
    }

    pub fn area(&self) -> Area {
        Area {
            journal_start: self.journal_start(),
            journal_blocks: self.journal_blocks,
            table_start: self.table_start(),
            table_blocks: self.table_blocks(),
            names: [
                (0, "disktable root block"),
                (1, "disktable LBN map"),
                (1 + self.lbn_blocks, "disktable refcount array"),
                (
                    1 + self.lbn_blocks + self.ref_blocks,
                    "disktable hash index",
                ),
                (u64::MAX, ""),
                (u64::MAX, ""),
            ],
        }
    }
}

/// crc32c of a table block's number and payload.
pub fn block_crc(block_no: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block_no.to_le_bytes()), payload)
}

/// Write the header of a table block whose payload is final.
pub fn seal_block(block_no: u64, block: &mut [u8]) {
    let crc = block_crc(block_no, &block[HEADER..]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
    block[4..HEADER].fill(0);
}

/// Is this a valid table block for `block_no` (or never written)?
pub fn block_ok(block_no: u64, block: &[u8]) -> bool {
    let stored = u32::from_le_bytes(block[..4].try_into().expect("4 bytes"));
    stored == block_crc(block_no, &block[HEADER..]) && block[4..HEADER] == [0; 4]
        || block.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_stay_inside_their_tables_and_blocks() {
        let cfg = DeviceConfig {
            uuid: [0; 16],
            backend: "disktable".into(),
            chunk_size: 4096,
            hash: crate::fingerprint::HashAlgo::Blake3,
            verify: false,
            logical_size: 100_000 * 4096,
            physical_chunks: 50_000,
            compression: crate::compress::Compression::None,
        };
        let g = Geometry::new(&cfg);
        let (b, o) = g.lbn(99_999);
        assert!(b <= g.lbn_blocks && o + 8 <= PAYLOAD);
        let (b, o) = g.refcount(49_999);
        assert!(b > g.lbn_blocks && b <= g.lbn_blocks + g.ref_blocks && o + 4 <= PAYLOAD);
        let (b, o) = g.slot(g.hash_slots - 1);
        assert!(b < g.table_blocks() && o + SLOT_BYTES <= PAYLOAD);
        assert_eq!(g.table_name(b), "disktable hash index");
    }

    #[test]
    fn sealed_blocks_check_their_number_and_contents() {
        let mut b = vec![7u8; BLOCK];
        seal_block(42, &mut b);
        assert!(block_ok(42, &b));
        assert!(
            !block_ok(43, &b),
            "a block written to the wrong place is caught"
        );
        b[100] ^= 1;
        assert!(!block_ok(42, &b));
        assert!(block_ok(9, &vec![0u8; BLOCK]), "never written");
    }
}
