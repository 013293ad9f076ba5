//! Where the sparse store keeps what on the metadata device. The layout is
//! disktable's (superblock slots, a redo journal, 4 KiB checksummed table
//! blocks), with tables whose cost follows what is stored:
//!
//! ```text
//! 0        superblock slots (8 KiB)
//! 8 KiB    journal (address space for every table block; only the
//!          largest commit so far is ever written)
//! T        table blocks: root, LBN map, refcount array, chunk records,
//!          refcount summary
//! ```
//! Every table is a dense array in a sparse file: a block never written is
//! a hole that reads as zeros, and a zero entry means empty (unmapped LBN,
//! free PBN, no record), so a new device costs a superblock and grows by
//! the blocks writes actually touch. Sequential allocation keeps the
//! refcount and record blocks of chunks written together side by side.
//! There is no on-disk hash table: the hash index lives in RAM
//! (`index.rs`) and is advice, confirmed against the chunk records.

use crate::backends::disktable::geometry::{Area, BLOCK, DESC_ENTRIES, PAYLOAD};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::superblock::SUPERBLOCK_AREA;

pub const LBNS_PER_BLOCK: u64 = (PAYLOAD / 8) as u64;
pub const REFS_PER_BLOCK: u64 = (PAYLOAD / 4) as u64;
/// A chunk record: a presence byte and the 32-byte fingerprint.
pub const RECORD_BYTES: usize = 33;
pub const RECORDS_PER_BLOCK: u64 = (PAYLOAD / RECORD_BYTES) as u64;
/// The summary keeps, per refcount block, how many of its PBNs are in use
/// and how many have a chunk record (two u16s).
pub const SUMMARY_BYTES: usize = 4;
pub const SUMMARIES_PER_BLOCK: u64 = (PAYLOAD / SUMMARY_BYTES) as u64;
/// The LBN summary keeps, per LBN-map block, how many of its LBNs are
/// mapped (a u16), so scans of the map skip blocks with none.
pub const LBN_SUMMARIES_PER_BLOCK: u64 = (PAYLOAD / 2) as u64;

/// Which table a table block is in, and its index in that table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Root,
    LbnMap(u64),
    Refcounts(u64),
    Records(u64),
    Summary(u64),
    LbnSummary(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub pbn_space: u64,
    pub logical_chunks: u64,
    pub journal_blocks: u64,
    pub lbn_blocks: u64,
    pub ref_blocks: u64,
    pub record_blocks: u64,
    pub summary_blocks: u64,
    pub lbn_summary_blocks: u64,
}

impl Geometry {
    pub fn new(cfg: &DeviceConfig) -> Geometry {
        let pbn_space = cfg.pbn_space();
        let logical_chunks = cfg.logical_chunks();
        let lbn_blocks = logical_chunks.div_ceil(LBNS_PER_BLOCK);
        let ref_blocks = pbn_space.div_ceil(REFS_PER_BLOCK);
        let record_blocks = pbn_space.div_ceil(RECORDS_PER_BLOCK);
        let summary_blocks = ref_blocks.div_ceil(SUMMARIES_PER_BLOCK);
        let lbn_summary_blocks = lbn_blocks.div_ceil(LBN_SUMMARIES_PER_BLOCK);
        let tables =
            1 + lbn_blocks + ref_blocks + record_blocks + summary_blocks + lbn_summary_blocks;
        // Room for a transaction of every table block, in address space
        // only: the file is sparse, and a commit writes its own length.
        let journal_blocks = 1 + tables.div_ceil(DESC_ENTRIES) + tables;
        Geometry {
            pbn_space,
            logical_chunks,
            journal_blocks,
            lbn_blocks,
            ref_blocks,
            record_blocks,
            summary_blocks,
            lbn_summary_blocks,
        }
    }

    pub fn table_blocks(&self) -> u64 {
        self.first_lbn_summary() + self.lbn_summary_blocks
    }

    pub fn table_start(&self) -> u64 {
        SUPERBLOCK_AREA + self.journal_blocks * BLOCK as u64
    }

    /// The length of the metadata file: address space, mostly holes.
    pub fn device_len(&self) -> u64 {
        self.table_start() + self.table_blocks() * BLOCK as u64
    }

    fn first_ref(&self) -> u64 {
        1 + self.lbn_blocks
    }

    /// The table blocks of the refcount summary.
    pub fn summary_table_blocks(&self) -> std::ops::Range<u64> {
        self.first_summary()..self.first_summary() + self.summary_blocks
    }

    /// The table blocks of the LBN summary.
    pub fn lbn_summary_table_blocks(&self) -> std::ops::Range<u64> {
        self.first_lbn_summary()..self.first_lbn_summary() + self.lbn_summary_blocks
    }

    /// The table blocks of the refcount array.
    pub fn ref_table_blocks(&self) -> std::ops::Range<u64> {
        self.first_ref()..self.first_ref() + self.ref_blocks
    }

    fn first_record(&self) -> u64 {
        self.first_ref() + self.ref_blocks
    }

    fn first_summary(&self) -> u64 {
        self.first_record() + self.record_blocks
    }

    fn first_lbn_summary(&self) -> u64 {
        self.first_summary() + self.summary_blocks
    }

    /// The LBN summary entry of LBN-map block `i` (0-based in its table).
    pub fn lbn_summary(&self, i: u64) -> (u64, usize) {
        (
            self.first_lbn_summary() + i / LBN_SUMMARIES_PER_BLOCK,
            (i % LBN_SUMMARIES_PER_BLOCK) as usize * 2,
        )
    }

    /// (table block, byte offset in its payload) of an LBN's entry.
    pub fn lbn(&self, lbn: Lbn) -> (u64, usize) {
        (
            1 + lbn / LBNS_PER_BLOCK,
            (lbn % LBNS_PER_BLOCK) as usize * 8,
        )
    }

    /// The LBN range an LBN-map block covers.
    pub fn lbns_of_block(&self, i: u64) -> std::ops::Range<Lbn> {
        i * LBNS_PER_BLOCK..((i + 1) * LBNS_PER_BLOCK).min(self.logical_chunks)
    }

    /// The PBNs refcount block `r` (0-based in its table) counts.
    pub fn pbns_of_ref_block(&self, r: u64) -> std::ops::Range<Pbn> {
        r * REFS_PER_BLOCK..((r + 1) * REFS_PER_BLOCK).min(self.pbn_space)
    }

    /// The PBNs chunk-record block `j` (0-based in its table) holds.
    pub fn pbns_of_record_block(&self, j: u64) -> std::ops::Range<Pbn> {
        j * RECORDS_PER_BLOCK..((j + 1) * RECORDS_PER_BLOCK).min(self.pbn_space)
    }

    /// The refcount blocks summary block `k` summarizes.
    pub fn ref_blocks_of_summary(&self, k: u64) -> std::ops::Range<u64> {
        k * SUMMARIES_PER_BLOCK..((k + 1) * SUMMARIES_PER_BLOCK).min(self.ref_blocks)
    }

    /// The LBN-map blocks LBN-summary block `k` summarizes.
    pub fn lbn_blocks_of_summary(&self, k: u64) -> std::ops::Range<u64> {
        k * LBN_SUMMARIES_PER_BLOCK..((k + 1) * LBN_SUMMARIES_PER_BLOCK).min(self.lbn_blocks)
    }

    /// Which table block `b` is in.
    pub fn place(&self, b: u64) -> Place {
        if b == 0 {
            Place::Root
        } else if b < self.first_ref() {
            Place::LbnMap(b - 1)
        } else if b < self.first_record() {
            Place::Refcounts(b - self.first_ref())
        } else if b < self.first_summary() {
            Place::Records(b - self.first_record())
        } else if b < self.first_lbn_summary() {
            Place::Summary(b - self.first_summary())
        } else {
            Place::LbnSummary(b - self.first_lbn_summary())
        }
    }

    pub fn refcount(&self, pbn: Pbn) -> (u64, usize) {
        (
            self.first_ref() + pbn / REFS_PER_BLOCK,
            (pbn % REFS_PER_BLOCK) as usize * 4,
        )
    }

    pub fn record(&self, pbn: Pbn) -> (u64, usize) {
        (
            self.first_record() + pbn / RECORDS_PER_BLOCK,
            (pbn % RECORDS_PER_BLOCK) as usize * RECORD_BYTES,
        )
    }

    /// The summary entry of refcount block `r` (0-based in its table).
    pub fn summary(&self, r: u64) -> (u64, usize) {
        (
            self.first_summary() + r / SUMMARIES_PER_BLOCK,
            (r % SUMMARIES_PER_BLOCK) as usize * SUMMARY_BYTES,
        )
    }

    pub fn area(&self) -> Area {
        Area {
            journal_start: SUPERBLOCK_AREA,
            journal_blocks: self.journal_blocks,
            table_start: self.table_start(),
            table_blocks: self.table_blocks(),
            names: [
                (0, "sparse root block"),
                (1, "sparse LBN map"),
                (self.first_ref(), "sparse refcount array"),
                (self.first_record(), "sparse chunk records"),
                (self.first_summary(), "sparse refcount summary"),
                (self.first_lbn_summary(), "sparse LBN summary"),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DeviceConfig {
        DeviceConfig {
            uuid: [0; 16],
            backend: "sparse".into(),
            chunk_size: 4096,
            hash: crate::fingerprint::HashAlgo::Blake3,
            verify: false,
            logical_size: 100_000 * 4096,
            physical_chunks: 50_000,
            compression: crate::compress::Compression::None,
        }
    }

    #[test]
    fn entries_stay_inside_their_tables() {
        let g = Geometry::new(&cfg());
        let a = g.area();
        let (b, o) = g.lbn(99_999);
        assert_eq!(a.table_name(b), "sparse LBN map");
        assert!(o + 8 <= PAYLOAD);
        let (b, o) = g.refcount(49_999);
        assert_eq!(a.table_name(b), "sparse refcount array");
        assert!(o + 4 <= PAYLOAD);
        let (b, o) = g.record(49_999);
        assert_eq!(a.table_name(b), "sparse chunk records");
        assert!(o + RECORD_BYTES <= PAYLOAD);
        let (b, o) = g.summary(g.ref_blocks - 1);
        assert_eq!(a.table_name(b), "sparse refcount summary");
        assert!(b < g.table_blocks() && o + SUMMARY_BYTES <= PAYLOAD);
        let (b, o) = g.lbn_summary(g.lbn_blocks - 1);
        assert_eq!(a.table_name(b), "sparse LBN summary");
        assert!(b == g.table_blocks() - 1 && o + 2 <= PAYLOAD);
    }

    #[test]
    fn place_names_the_table_and_index_of_every_entry() {
        let g = Geometry::new(&cfg());
        assert_eq!(g.place(0), Place::Root);
        assert_eq!(
            g.place(g.lbn(99_999).0),
            Place::LbnMap(99_999 / LBNS_PER_BLOCK)
        );
        let r = 49_999 / REFS_PER_BLOCK;
        assert_eq!(g.place(g.refcount(49_999).0), Place::Refcounts(r));
        assert!(g.pbns_of_ref_block(r).contains(&49_999));
        let j = 49_999 / RECORDS_PER_BLOCK;
        assert_eq!(g.place(g.record(49_999).0), Place::Records(j));
        assert_eq!(g.pbns_of_record_block(j).end, g.pbn_space);
        assert_eq!(g.place(g.summary(r).0), Place::Summary(0));
        assert!(g.ref_blocks_of_summary(0).contains(&r));
        let i = g.lbn_blocks - 1;
        assert_eq!(g.place(g.lbn_summary(i).0), Place::LbnSummary(0));
        assert!(g.lbn_blocks_of_summary(0).contains(&i));
    }
}
