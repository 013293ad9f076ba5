//! Statistics (Dmdedup §2.6 "Statistics"): the engine's counters, kept in
//! atomics while serving and saved with the metadata, and the `Stats`
//! snapshot that `dedup status` prints.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::backend::MetaIoStats;

macro_rules! define_counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Live counters; each is a relaxed atomic (they are statistics, not state).
        #[derive(Default)]
        pub struct Counters {
            $(pub $name: AtomicU64,)*
        }

        /// A copy of the counters at one instant.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct CounterValues {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            pub fn snapshot(&self) -> CounterValues {
                CounterValues { $($name: self.$name.load(Ordering::Relaxed),)* }
            }

            /// In persisted order. New counters are only ever appended.
            pub fn to_vec(&self) -> Vec<u64> {
                vec![$(self.$name.load(Ordering::Relaxed),)*]
            }

            /// Restore from a saved vector (older saves may be shorter).
            pub fn load(&self, saved: &[u64]) {
                let mut it = saved.iter();
                $(if let Some(v) = it.next() { self.$name.store(*v, Ordering::Relaxed); })*
            }
        }
    };
}

define_counters! {
    /// Read requests from clients.
    read_requests,
    /// Write requests from clients.
    write_requests,
    /// Chunks read (a request covers one or more).
    reads,
    /// Chunks written.
    writes,
    /// Chunk writes of content not seen before: new data stored.
    unique_writes,
    /// Chunk writes of content already stored: no data written.
    duplicate_writes,
    /// Chunk writes to an LBN that already held other data.
    overwrites,
    /// Chunk writes of the data the LBN already held.
    rewrites,
    /// Chunk writes of all zeros: never stored.
    zero_writes,
    /// Partial-chunk writes that had to read the chunk first (read-modify-write).
    rmw_reads,
    /// Trim/discard requests.
    discard_requests,
    /// Chunks unmapped by trim/discard or write-zeroes.
    discarded_chunks,
    /// Flush requests (FUA writes included).
    flushes,
    /// Bytes clients read.
    bytes_read,
    /// Bytes clients wrote.
    bytes_written,
    /// Bytes written to the data device.
    data_bytes_written,
    /// Bytes read from the data device.
    data_bytes_read,
    /// Garbage collection passes.
    gc_runs,
    /// Chunks freed by garbage collection.
    gc_reclaimed,
    /// Fingerprint hits whose bytes differed (verify mode): stored apart.
    verify_mismatches,
    /// Writes refused because the data device was full.
    nospace_errors,
    /// Write-zeroes requests.
    write_zeroes_requests,
    /// Metadata commits (flushes, FUA writes, transaction ends).
    commits,
    /// Packed blocks garbage collection emptied by repacking their live
    /// fragments into fewer blocks.
    gc_repacked_blocks,
    /// Mutations (writes, trims, write-zeroes) acknowledged before they
    /// were applied: write-back took them.
    write_back_requests,
    /// Of those, mutations that then failed; the next flush reported it.
    write_back_failures,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Everything `dedup status` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    pub backend: String,
    pub hash: String,
    pub verify: bool,
    pub chunk_size: u32,
    pub logical_size: u64,
    pub physical_size: u64,
    #[serde(flatten)]
    pub counters: CounterValues,
    /// Chunks on the data device holding data (reference count > 0).
    pub chunks_stored: u64,
    /// LBNs mapped to a stored chunk (all-zero chunks are never mapped).
    pub chunks_mapped: u64,
    pub hash_index_entries: u64,
    /// Of `chunks_stored`, those held by the hash index alone (reference
    /// count 1, no LBN maps them: overwritten or trimmed data) until a
    /// collection (`dedup gc`, or the device when it fills) frees them.
    #[serde(default)]
    pub chunks_awaiting_gc: u64,
    /// Data space beyond the logical size, up to the reserve `dedup create`
    /// adds: while it is there, overwrites of a full device always fit. 0
    /// on a thin-provisioned device (logical size over physical), whose
    /// writes can run out of space.
    #[serde(default)]
    pub overwrite_reserve_bytes: u64,
    /// sparse: the RAM index's budget, fill, sampling and lookups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_index: Option<crate::backend::IndexFigures>,
    pub physical_bytes_used: u64,
    /// Bytes the data file takes on the host filesystem (its allocated
    /// blocks; a block device's whole size), beside `physical_bytes_used`:
    /// freed blocks are punched once their freeing is committed, so on a
    /// sparse file the two stay close (plus the 4 KiB header and blocks
    /// freed but not yet committed). `None` where unknown (thin, memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_allocated_bytes: Option<u64>,
    pub physical_bytes_free: u64,
    pub physical_used_percent: f64,
    pub logical_bytes_mapped: u64,
    pub metadata_bytes: u64,
    /// Mapped non-zero chunks per stored chunk (storage dedup ratio),
    /// chunks awaiting collection counted as stored: what the data device
    /// holds now.
    pub dedup_ratio: f64,
    /// Mapped non-zero chunks per live stored chunk (those awaiting
    /// collection left out): what dedup gives once `dedup gc` has run.
    #[serde(default)]
    pub live_dedup_ratio: f64,
    /// Bytes clients wrote per byte written to the data device (I/O dedup ratio).
    pub io_dedup_ratio: f64,
    pub metadata_io: MetaIoStats,
    /// How new chunks are compressed (none, lz4, zstd:LEVEL).
    pub compression: String,
    /// Data blocks holding chunks (packed blocks hold several).
    pub data_blocks_used: u64,
    /// Mapped logical bytes per physical data byte in use: what dedup and
    /// compression together give back.
    pub space_ratio: f64,
    /// Bytes of the stored chunks per physical data byte holding them
    /// (compression and packing; 1 without compression).
    pub compression_ratio: f64,
    /// Chunks stored raw because they did not compress by an eighth.
    pub incompressible_chunks: u64,
    /// Packing figures, on a device that packs compressed chunks.
    #[serde(default)]
    pub packing: Option<crate::placement::PackingStats>,
    /// Figures particular to the placement (thin: windows, C-blocks, entries
    /// embedded, metadata blocks, recovery), by name.
    #[serde(default)]
    pub backend_stats: std::collections::BTreeMap<String, u64>,
    /// Changed-block tracking, if the device tracks and trusts it: the
    /// mark a backup by fingerprint started it from, and the regions (of
    /// `region_chunks` chunks) changed since. `None`: the next backup by
    /// fingerprint walks every block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingFigures>,
    /// A backup's snapshot, while one runs: why a collection leaves the
    /// chunks it holds alone until it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotFigures>,
}

/// What `Stats::snapshot` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFigures {
    /// LBNs changed since the freeze, whose earlier mapping it keeps.
    pub lbns_kept: u64,
    /// Chunks it holds (no collection frees them until it ends).
    pub chunks_held: u64,
    /// Given up: it would have kept too much, and its backup's later
    /// reads fail.
    pub given_up: bool,
}

/// What `Stats::tracking` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackingFigures {
    pub mark: u64,
    pub regions_changed: u64,
    pub region_chunks: u64,
}

pub(crate) fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_round_trip_through_their_saved_form() {
        let c = Counters::default();
        Counters::add(&c.writes, 5);
        Counters::add(&c.nospace_errors, 2);
        let saved = c.to_vec();
        let d = Counters::default();
        d.load(&saved);
        assert_eq!(c.snapshot(), d.snapshot());
        let e = Counters::default();
        e.load(&saved[..1]);
        assert_eq!(e.snapshot().read_requests, 0);
    }
}
