//! Human-readable reports of a device (status, gc, check, its sizing),
//! and the status report itself, which `dedup status --json` prints as
//! is (JSON output bypasses the text here). The layer below the commands
//! that print them: it imports none of them.

use std::fmt::Write;

use dedup_core::backends::sparse::Sizing;
use dedup_core::engine::{CheckReport, GcReport, LostRange};
use dedup_core::size::format_size;
use dedup_core::stats::Stats;
use serde::Serialize;

#[derive(Serialize)]
pub struct StatusReport {
    pub device: String,
    /// True when read live from a running `dedup serve`.
    pub served: bool,
    #[serde(flatten)]
    pub stats: Stats,
}

pub fn status(r: &StatusReport) -> String {
    let s = &r.stats;
    let c = &s.counters;
    let cs = format_size(s.chunk_size as u64);
    let mut o = String::new();
    let state = if r.served { "serving" } else { "stopped" };
    let _ = writeln!(
        o,
        "Device {} ({state}): {} backend, {} fingerprints{}, {cs} chunks, compression {}",
        r.device,
        s.backend,
        s.hash,
        if s.verify { " + byte verify" } else { "" },
        s.compression
    );
    let _ = writeln!(
        o,
        "  Space ratio      {:.2}   (mapped logical bytes per physical data byte in use; compression {:.2})",
        s.space_ratio, s.compression_ratio
    );
    let _ = writeln!(
        o,
        "  Dedup ratio      {:.2}   (mapped chunks per stored chunk, {} awaiting gc counted as stored; I/O dedup ratio {:.2})",
        s.dedup_ratio, s.chunks_awaiting_gc, s.io_dedup_ratio
    );
    let _ = writeln!(
        o,
        "  Live dedup ratio {:.2}   (mapped chunks per stored chunk still mapped: the dedup ratio once `dedup gc` has run)",
        s.live_dedup_ratio
    );
    let _ = writeln!(
        o,
        "  Logical          {} in all, {} mapped ({} chunks)",
        format_size(s.logical_size),
        format_size(s.logical_bytes_mapped),
        s.chunks_mapped
    );
    let _ = writeln!(
        o,
        "  Physical         {} in all, {} used ({} chunks, {:.1}%), {} free",
        format_size(s.physical_size),
        format_size(s.physical_bytes_used),
        s.chunks_stored,
        s.physical_used_percent,
        format_size(s.physical_bytes_free)
    );
    match &s.tracking {
        Some(t) => {
            let _ = writeln!(
                o,
                "  Tracking         {} regions of {} chunks changed since the last backup by fingerprint (mark {:016x})",
                t.regions_changed, t.region_chunks, t.mark
            );
        }
        None => {
            let _ = writeln!(
                o,
                "  Tracking         none: the next backup by fingerprint (`dedup backup --device`) walks every block"
            );
        }
    }
    if let Some(f) = &s.snapshot {
        let _ = match f.given_up {
            false => writeln!(
                o,
                "  Snapshot         a backup is running: {} LBNs changed since it froze the map, {} chunks held until it ends (no collection frees them)",
                f.lbns_kept, f.chunks_held
            ),
            true => writeln!(
                o,
                "  Snapshot         given up (too much changed while the backup ran): its backup's later reads fail"
            ),
        };
    }
    if let Some(a) = s.data_allocated_bytes {
        let _ = writeln!(
            o,
            "  Data file        {} allocated on the host (freed blocks are given back once committed)",
            format_size(a)
        );
    }
    if s.overwrite_reserve_bytes > 0 {
        let _ = writeln!(
            o,
            "  Reserve          {} beyond the logical size: overwrites of a full device always fit",
            format_size(s.overwrite_reserve_bytes)
        );
    } else if s.physical_size < s.logical_size {
        let _ = writeln!(
            o,
            "  Thin-provisioned the logical size exceeds the physical one: writes of new data fail with ENOSPC once it is full"
        );
    }
    if let Some(p) = &s.packing {
        let _ = writeln!(
            o,
            "  Packing          {} packed blocks holding {} fragments ({:.2} per block), {} incompressible chunks stored raw, {} bins open",
            p.packed_blocks, p.fragments, p.fragments_per_block, s.incompressible_chunks, p.open_bins
        );
        let _ = writeln!(
            o,
            "                   since start: {} packed blocks written ({} before they were full), {:.1}% filled; repacking emptied {} blocks into {}, moving {} fragments",
            p.bins_written,
            p.bins_written_early,
            p.written_fill_percent,
            p.repacked_blocks,
            p.repack_blocks_written,
            p.fragments_moved
        );
    }
    let _ = writeln!(
        o,
        "  Metadata         {} ({} hash index entries)",
        format_size(s.metadata_bytes),
        s.hash_index_entries
    );
    if let Some(ix) = &s.hash_index {
        let _ = writeln!(
            o,
            "  Index in RAM     {} of {} budget, {} fingerprints, keeps 1 in {}{}; {} prefetched; lookups since start: {} hits, {} by prefetch, {} misses, {} stale; about {} duplicates missed by sampling (estimated from the {} lookups of sampled fingerprints)",
            format_size(ix.bytes),
            format_size(ix.index_memory),
            ix.entries,
            ix.sampling_period,
            match (ix.from_checkpoint, ix.records_to_warm) {
                (true, _) => ", loaded from the last clean stop's checkpoint".to_string(),
                (false, 0) => String::new(),
                (false, n) => format!(", rebuilding: {n} records still to read"),
            },
            ix.prefetched_fingerprints,
            ix.table_hits,
            ix.prefetch_hits,
            ix.misses,
            ix.stale,
            ix.missed_estimate,
            ix.sampled_lookups
        );
    }
    let _ = writeln!(
        o,
        "Writes           {} requests, {} written, {} chunks:",
        c.write_requests,
        format_size(c.bytes_written),
        c.writes
    );
    let _ = writeln!(
        o,
        "  unique {}  duplicate {}  zero {}  overwrites {}  rewrites {}  read-modify-write {}",
        c.unique_writes, c.duplicate_writes, c.zero_writes, c.overwrites, c.rewrites, c.rmw_reads
    );
    let _ = writeln!(
        o,
        "  data device: {} written, {} read",
        format_size(c.data_bytes_written),
        format_size(c.data_bytes_read)
    );
    let _ = writeln!(
        o,
        "Reads            {} requests, {} read, {} chunks",
        c.read_requests,
        format_size(c.bytes_read),
        c.reads
    );
    let _ = writeln!(
        o,
        "Discards         {} trim + {} write-zeroes requests, {} chunks unmapped;  flushes {}",
        c.discard_requests, c.write_zeroes_requests, c.discarded_chunks, c.flushes
    );
    let _ = writeln!(
        o,
        "GC               {} runs, {} chunks reclaimed",
        c.gc_runs, c.gc_reclaimed
    );
    if c.nospace_errors > 0 || c.verify_mismatches > 0 {
        let _ = writeln!(o, "Errors           {} writes refused for lack of space, {} fingerprint collisions caught by verify", c.nospace_errors, c.verify_mismatches);
    }
    let m = &s.metadata_io;
    let _ = writeln!(
        o,
        "Metadata I/O     {} reads ({}), {} writes ({}), {} syncs",
        m.reads,
        format_size(m.bytes_read),
        m.writes,
        format_size(m.bytes_written),
        m.syncs
    );
    o
}

pub fn gc(r: &GcReport) -> String {
    let mut o = format!(
        "Reclaimed {} chunks ({} of data space) in {:.3} s; {} hash index entries examined.",
        r.reclaimed,
        format_size(r.bytes_reclaimed),
        r.seconds,
        r.scanned
    );
    if r.blocks_repacked > 0 || r.damaged_blocks > 0 {
        o.push_str(&format!(
            "\nRepacked {} mostly dead packed blocks into {}, moving {} fragments.",
            r.blocks_repacked, r.repack_blocks_written, r.fragments_moved
        ));
    }
    if r.damaged_blocks > 0 {
        o.push_str(&format!(
            "\n{} damaged packed blocks were left alone: run `dedup check --data` to see which chunks they hold.",
            r.damaged_blocks
        ));
    }
    o
}

/// The logical ranges a repair unmapped because the LBN-map block that
/// held them was damaged.
pub fn lost(ranges: &[LostRange]) -> String {
    let mut o = String::new();
    for l in ranges {
        let _ = writeln!(
            o,
            "lost, now reading as zeros: LBNs {} to {} (bytes {} to {}), whose mappings were in {} block {}",
            l.first_lbn,
            l.last_lbn,
            l.offset,
            l.offset + l.length - 1,
            l.table,
            l.block
        );
    }
    o
}

pub fn check(r: &CheckReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} LBNs mapped, {} chunks stored, {} hash index entries, {} reclaimable by GC{}",
        r.lbns_mapped,
        r.pbns_used,
        r.hash_index_entries,
        r.reclaimable_chunks,
        if r.chunks_verified > 0 {
            format!(", {} chunks re-hashed", r.chunks_verified)
        } else {
            String::new()
        }
    );
    if r.is_clean() {
        let _ = writeln!(o, "clean: no problems found");
    } else {
        let _ = writeln!(o, "{} problems found:", r.problems.len());
        for p in &r.problems {
            let _ = writeln!(o, "  {:?}: {}", p.kind, p.detail);
        }
    }
    o
}

/// What a device costs as it fills (create and grow print it).
pub fn sizing(s: &Sizing) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "What it costs as it fills: {} B of metadata per stored chunk ({} per TiB of unique data), nothing for space never written.",
        s.metadata_bytes_per_chunk,
        format_size(s.metadata_bytes_per_tib)
    );
    let _ = writeln!(
        o,
        "RAM: a {} metadata cache, up to {} for the hash index, and summaries that grow with what is stored, about {} per TiB of unique data, up to {}. The index keeps every fingerprint of the first {} of unique data; beyond that it samples. Data copied in the order first written still finds about {:.0}% of duplicates at 1/8 of the memory a full index would need, {:.0}% at 1/32 (Guo's Eq. 2); data in another order finds far fewer (shuffled copies: about half at 1/16). `dedup status` counts what it missed; raise --index-memory to keep more.",
        format_size(s.ram_cache_bytes),
        format_size(s.index_memory),
        format_size(s.ram_summary_bytes_per_tib),
        format_size(s.ram_summary_bytes),
        format_size(s.full_index_bytes),
        s.efficiency_at_eighth * 100.0,
        s.efficiency_at_thirty_second * 100.0
    );
    o
}
