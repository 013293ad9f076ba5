//! `dedup status --prometheus`: a device's statistics in the Prometheus text
//! exposition format (version 0.0.4, which OpenMetrics parsers also read),
//! for a scrape through node_exporter's textfile collector or any agent
//! that reads that format.
//!
//! Counters are the figures that only grow (requests, bytes, chunks; some
//! only since the server started, which Prometheus treats as a counter
//! reset); everything that can go down is a gauge. Shares are plain
//! fractions from 0 to 1 (`_ratio`, 0.5 not 50), as the Prometheus naming
//! conventions ask; what dedup and compression multiply (3 logical bytes
//! per byte stored) is no share and ends `_factor`; sizes are bytes
//! (`_bytes`).

use std::fmt::Write;

use dedup_core::stats::Stats;

/// One metric family: its name, help, type and samples. Each sample's
/// labels come after the `device` label every sample carries.
struct Family {
    name: String,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

#[derive(Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

/// The counters of `CounterValues`, by their JSON key: the metric name's
/// middle part and its help. A test checks that every key `Stats` has is
/// here, so a counter added to the engine is not silently left out.
const COUNTERS: &[(&str, &str, &str)] = &[
    (
        "read_requests",
        "read_requests",
        "Read requests from clients.",
    ),
    (
        "write_requests",
        "write_requests",
        "Write requests from clients.",
    ),
    (
        "reads",
        "read_chunks",
        "Chunks read (a request covers one or more).",
    ),
    ("writes", "written_chunks", "Chunks written."),
    (
        "unique_writes",
        "unique_written_chunks",
        "Chunk writes of content not seen before: new data stored.",
    ),
    (
        "duplicate_writes",
        "duplicate_written_chunks",
        "Chunk writes of content already stored: no data written.",
    ),
    (
        "overwrites",
        "overwritten_chunks",
        "Chunk writes to an LBN that already held other data.",
    ),
    (
        "rewrites",
        "rewritten_chunks",
        "Chunk writes of the data the LBN already held.",
    ),
    (
        "zero_writes",
        "zero_written_chunks",
        "Chunk writes of all zeros: never stored.",
    ),
    (
        "rmw_reads",
        "read_modify_write_chunks",
        "Partial-chunk writes that had to read the chunk first.",
    ),
    (
        "discard_requests",
        "discard_requests",
        "Trim/discard requests.",
    ),
    (
        "discarded_chunks",
        "discarded_chunks",
        "Chunks unmapped by trim/discard or write-zeroes.",
    ),
    (
        "flushes",
        "flush_requests",
        "Flush requests (FUA writes included).",
    ),
    ("bytes_read", "read_bytes", "Bytes clients read."),
    ("bytes_written", "written_bytes", "Bytes clients wrote."),
    (
        "data_bytes_written",
        "data_device_written_bytes",
        "Bytes written to the data device.",
    ),
    (
        "data_bytes_read",
        "data_device_read_bytes",
        "Bytes read from the data device.",
    ),
    ("gc_runs", "gc_runs", "Garbage collection passes."),
    (
        "gc_reclaimed",
        "gc_reclaimed_chunks",
        "Chunks freed by garbage collection.",
    ),
    (
        "verify_mismatches",
        "verify_mismatches",
        "Fingerprint hits whose bytes differed (verify mode): stored apart.",
    ),
    (
        "nospace_errors",
        "nospace_errors",
        "Writes refused because the data device was full (ENOSPC).",
    ),
    (
        "write_zeroes_requests",
        "write_zeroes_requests",
        "Write-zeroes requests.",
    ),
    (
        "commits",
        "metadata_commits",
        "Metadata commits (flushes, FUA writes, transaction ends).",
    ),
    (
        "gc_repacked_blocks",
        "gc_repacked_blocks",
        "Packed blocks garbage collection emptied by repacking.",
    ),
    (
        "write_back_requests",
        "write_back_requests",
        "Mutations acknowledged before they were applied (write-back).",
    ),
    (
        "write_back_failures",
        "write_back_failures",
        "Write-back mutations that then failed; the next flush reported each.",
    ),
];

/// The exposition text for one device: `device` labels every sample.
pub fn render(device: &str, served: bool, s: &Stats) -> String {
    let mut f = Families::default();
    let b = |v: bool| Value::Int(v as u64);
    f.gauge("served", "1 while a `dedup serve` process serves the device (figures read live), 0 if it was opened stopped.", b(served));
    f.labelled(
        "info",
        "The device's configuration, in labels; always 1.",
        Kind::Gauge,
        vec![
            ("backend", s.backend.clone()),
            ("hash", s.hash.clone()),
            ("compression", s.compression.clone()),
            ("verify", s.verify.to_string()),
        ],
        Value::Int(1),
    );
    f.gauge(
        "chunk_size_bytes",
        "Deduplication chunk size.",
        Value::Int(s.chunk_size.into()),
    );
    f.gauge(
        "logical_size_bytes",
        "Size of the device clients see.",
        Value::Int(s.logical_size),
    );
    f.gauge(
        "logical_mapped_bytes",
        "Logical bytes mapped to a stored chunk (all-zero chunks are never mapped).",
        Value::Int(s.logical_bytes_mapped),
    );
    f.gauge(
        "physical_size_bytes",
        "Size of the data device.",
        Value::Int(s.physical_size),
    );
    f.gauge(
        "physical_used_bytes",
        "Data device bytes in use.",
        Value::Int(s.physical_bytes_used),
    );
    f.gauge(
        "physical_free_bytes",
        "Data device bytes free: writes of new data fail with ENOSPC at 0.",
        Value::Int(s.physical_bytes_free),
    );
    f.gauge(
        "physical_used_ratio",
        "Share of the data device in use (0 to 1).",
        Value::Float(s.physical_used_percent / 100.0),
    );
    f.gauge("overwrite_reserve_bytes", "Data space beyond the logical size; 0 on a thin-provisioned device, whose writes can run out of space.", Value::Int(s.overwrite_reserve_bytes));
    f.gauge(
        "metadata_bytes",
        "Bytes of metadata on the metadata device.",
        Value::Int(s.metadata_bytes),
    );
    if let Some(bytes) = s.data_allocated_bytes {
        f.gauge(
            "data_allocated_bytes",
            "Bytes the data file takes on the host (freed chunks are punched out, so it follows physical_used_bytes).",
            Value::Int(bytes),
        );
    }
    f.gauge(
        "space_factor",
        "Mapped logical bytes per physical data byte in use: dedup and compression together.",
        Value::Float(s.space_ratio),
    );
    f.gauge(
        "dedup_factor",
        "Mapped non-zero chunks per stored chunk (storage dedup ratio), chunks awaiting gc counted as stored.",
        Value::Float(s.dedup_ratio),
    );
    f.gauge(
        "live_dedup_factor",
        "Mapped non-zero chunks per stored chunk still mapped (chunks awaiting gc left out).",
        Value::Float(s.live_dedup_ratio),
    );
    f.gauge(
        "io_dedup_factor",
        "Bytes clients wrote per byte written to the data device.",
        Value::Float(s.io_dedup_ratio),
    );
    f.gauge(
        "compression_factor",
        "Bytes of the stored chunks per physical data byte holding them.",
        Value::Float(s.compression_ratio),
    );
    f.gauge(
        "stored_chunks",
        "Chunks on the data device holding data (reference count > 0).",
        Value::Int(s.chunks_stored),
    );
    f.gauge(
        "awaiting_gc_chunks",
        "Stored chunks held by the hash index alone (overwritten or trimmed data) until a gc frees them.",
        Value::Int(s.chunks_awaiting_gc),
    );
    f.gauge(
        "mapped_chunks",
        "LBNs mapped to a stored chunk.",
        Value::Int(s.chunks_mapped),
    );
    f.gauge(
        "hash_index_entries",
        "Entries in the backend's hash index.",
        Value::Int(s.hash_index_entries),
    );
    f.gauge(
        "data_blocks_used",
        "Data blocks holding chunks (packed blocks hold several).",
        Value::Int(s.data_blocks_used),
    );
    f.gauge(
        "incompressible_chunks",
        "Chunks stored raw because they did not compress by an eighth.",
        Value::Int(s.incompressible_chunks),
    );
    counters(&mut f, s);
    meta_io(&mut f, s);
    hash_index(&mut f, s);
    packing(&mut f, s);
    for (name, v) in &s.backend_stats {
        f.labelled(
            "backend_figure",
            "A figure particular to the backend's placement (thin: windows, C-blocks, recovery), by name.",
            Kind::Gauge,
            vec![("name", name.clone())],
            Value::Int(*v),
        );
    }
    f.text(device)
}

fn counters(f: &mut Families, s: &Stats) {
    let values = serde_json::to_value(&s.counters).unwrap_or_default();
    for (key, name, help) in COUNTERS {
        if let Some(v) = values.get(key).and_then(|v| v.as_u64()) {
            f.counter(name, help, Value::Int(v));
        }
    }
}

fn meta_io(f: &mut Families, s: &Stats) {
    let m = &s.metadata_io;
    let i = Value::Int;
    f.counter(
        "metadata_io_reads",
        "Metadata device reads since the device was opened.",
        i(m.reads),
    );
    f.counter(
        "metadata_io_writes",
        "Metadata device writes since the device was opened.",
        i(m.writes),
    );
    f.counter(
        "metadata_io_syncs",
        "Metadata device syncs since the device was opened.",
        i(m.syncs),
    );
    f.counter(
        "metadata_io_read_bytes",
        "Bytes read from the metadata device since the device was opened.",
        i(m.bytes_read),
    );
    f.counter(
        "metadata_io_written_bytes",
        "Bytes written to the metadata device since the device was opened.",
        i(m.bytes_written),
    );
    f.counter(
        "metadata_cache_hits",
        "Metadata cache hits since the device was opened.",
        i(m.cache_hits),
    );
    f.counter(
        "metadata_cache_misses",
        "Metadata cache misses since the device was opened.",
        i(m.cache_misses),
    );
}

/// sparse's RAM index: what to alert on when it fills and starts sampling.
fn hash_index(f: &mut Families, s: &Stats) {
    let Some(ix) = &s.hash_index else { return };
    let i = Value::Int;
    f.gauge(
        "hash_index_budget_bytes",
        "RAM budget of the hash index (--index-memory).",
        i(ix.index_memory),
    );
    f.gauge(
        "hash_index_memory_bytes",
        "RAM the hash index holds now (table and prefetched fingerprints).",
        i(ix.bytes),
    );
    let fill = if ix.index_memory == 0 {
        0.0
    } else {
        ix.bytes as f64 / ix.index_memory as f64
    };
    f.gauge(
        "hash_index_fill_ratio",
        "RAM the hash index holds per byte of its budget: sampling starts at 1.",
        Value::Float(fill),
    );
    f.gauge(
        "hash_index_fingerprints",
        "Fingerprints in the RAM hash index.",
        i(ix.entries),
    );
    f.gauge(
        "hash_index_sampling_period",
        "The index keeps 1 fingerprint in this many (1: every one).",
        i(ix.sampling_period),
    );
    let rate = 1.0 / ix.sampling_period.max(1) as f64;
    f.gauge(
        "hash_index_sampling_ratio",
        "Share of fingerprints the index keeps (1: every one; below 1 some duplicates are missed).",
        Value::Float(rate),
    );
    f.gauge(
        "hash_index_prefetched_fingerprints",
        "Fingerprints in the prefetch cache.",
        i(ix.prefetched_fingerprints),
    );
    f.counter(
        "hash_index_table_hits",
        "Lookups the index table answered, since the server started.",
        i(ix.table_hits),
    );
    f.counter(
        "hash_index_prefetch_hits",
        "Lookups the prefetch cache answered, since the server started.",
        i(ix.prefetch_hits),
    );
    f.counter(
        "hash_index_misses",
        "Lookups not answered (new data, or data sampling missed), since the server started.",
        i(ix.misses),
    );
    f.counter(
        "hash_index_stale",
        "Index candidates that failed confirmation, since the server started.",
        i(ix.stale),
    );
    f.gauge(
        "hash_index_missed_duplicates_estimate",
        "Duplicates sampling missed since the server started, estimated from the hit share of sampled fingerprints.",
        i(ix.missed_estimate),
    );
    f.gauge(
        "hash_index_from_checkpoint",
        "1 if the index was loaded from the last clean stop's checkpoint, 0 if rebuilt.",
        Value::Int(ix.from_checkpoint as u64),
    );
    f.gauge(
        "hash_index_records_to_warm",
        "Chunk records still to read into the index after a rebuild (0 once whole).",
        i(ix.records_to_warm),
    );
}

fn packing(f: &mut Families, s: &Stats) {
    let Some(p) = &s.packing else { return };
    let i = Value::Int;
    f.gauge(
        "packing_raw_blocks",
        "Blocks holding one chunk stored raw.",
        i(p.raw_blocks),
    );
    f.gauge(
        "packing_packed_blocks",
        "Blocks holding compressed fragments.",
        i(p.packed_blocks),
    );
    f.gauge(
        "packing_fragments",
        "Live fragments in packed blocks.",
        i(p.fragments),
    );
    f.gauge(
        "packing_fragments_per_block",
        "Live fragments per packed block.",
        Value::Float(p.fragments_per_block),
    );
    f.gauge(
        "packing_open_bins",
        "Bins being filled in RAM.",
        i(p.open_bins),
    );
    f.counter(
        "packing_bins_written",
        "Packed blocks written since the server started.",
        i(p.bins_written),
    );
    f.counter(
        "packing_bins_written_early",
        "Packed blocks a commit sent out before they were full, since the server started.",
        i(p.bins_written_early),
    );
    f.gauge(
        "packing_written_fill_ratio",
        "Fragment bytes per byte of the packed blocks written since the server started.",
        Value::Float(p.written_fill_percent / 100.0),
    );
    f.counter(
        "packing_repacked_blocks",
        "Blocks a repack emptied, since the server started.",
        i(p.repacked_blocks),
    );
    f.counter(
        "packing_repack_blocks_written",
        "Blocks a repack wrote, since the server started.",
        i(p.repack_blocks_written),
    );
    f.counter(
        "packing_fragments_moved",
        "Fragments a repack moved, since the server started.",
        i(p.fragments_moved),
    );
}

#[derive(Default)]
struct Families(Vec<Family>);

impl Families {
    fn gauge(&mut self, name: &str, help: &'static str, v: Value) {
        self.labelled(name, help, Kind::Gauge, Vec::new(), v);
    }

    fn counter(&mut self, name: &str, help: &'static str, v: Value) {
        self.labelled(name, help, Kind::Counter, Vec::new(), v);
    }

    /// Adds a sample to the family `name` (made on first use), so a family
    /// with several samples (`backend_figure`) gets one HELP and TYPE.
    fn labelled(
        &mut self,
        name: &str,
        help: &'static str,
        kind: Kind,
        labels: Vec<(&'static str, String)>,
        v: Value,
    ) {
        let name = match kind {
            Kind::Counter => format!("dedup_{name}_total"),
            Kind::Gauge => format!("dedup_{name}"),
        };
        match self.0.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push((labels, v)),
            None => self.0.push(Family {
                name,
                help,
                kind,
                samples: vec![(labels, v)],
            }),
        }
    }

    fn text(&self, device: &str) -> String {
        let mut o = String::new();
        for f in &self.0 {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(o, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(o, "# TYPE {} {kind}", f.name);
            for (labels, v) in &f.samples {
                let mut l = format!("device=\"{}\"", escape_label(device));
                for (k, val) in labels {
                    let _ = write!(l, ",{k}=\"{}\"", escape_label(val));
                }
                let _ = writeln!(o, "{}{{{l}}} {}", f.name, value(*v));
            }
        }
        o
    }
}

/// Label values escape backslash, double quote and line feed (the format
/// allows nothing else to be escaped, and nothing else needs it).
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// HELP text escapes backslash and line feed only.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Rust prints infinities as `inf`, which Prometheus does not read.
fn value(v: Value) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        Value::Float(x) if x.is_nan() => "NaN".into(),
        Value::Float(x) if x.is_infinite() => if x > 0.0 { "+Inf" } else { "-Inf" }.into(),
        Value::Float(x) => x.to_string(),
    }
}

#[cfg(test)]
mod tests;
