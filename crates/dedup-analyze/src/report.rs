//! The numbers per algorithm (the paper's Table 3 and more), and the
//! table, CSV and JSON that carry them.

use std::fmt::Write;

use serde::Serialize;

use crate::algo::Algorithm;
use crate::analysis::{Analysis, Codec, Counts};
use crate::index::BYTES_PER_ENTRY;

/// Bytes of one hash-index entry in a deduplicating store: a 32-byte
/// fingerprint and an 8-byte location.
pub const INDEX_ENTRY_BYTES: u64 = 40;
/// Bytes of one recipe entry (a chunk reference in a file or an LBN map):
/// an 8-byte location and a 4-byte length.
pub const RECIPE_ENTRY_BYTES: u64 = 12;

#[derive(Clone, Debug, Serialize)]
pub struct AlgoReport {
    pub algorithm: Algorithm,
    pub label: String,
    pub logical_bytes: u64,
    pub unique_bytes: u64,
    /// logical / unique bytes.
    pub fold_factor: f64,
    /// 1 - unique / logical.
    pub space_saved: f64,
    pub chunks: u64,
    pub unique_chunks: u64,
    pub mean_chunk_bytes: f64,
    pub zero_chunks: u64,
    /// Share of the logical bytes in all-zero chunks.
    pub zero_share: f64,
    /// Distinct chunks × `INDEX_ENTRY_BYTES`.
    pub index_bytes: u64,
    /// Chunks × `RECIPE_ENTRY_BYTES`.
    pub recipe_bytes: u64,
    /// (index + recipe) / unique bytes: the metadata cost of the savings.
    pub metadata_share: f64,
    /// CPU seconds finding boundaries (0 for WFH and FBH) and hashing.
    pub chunk_cpu_s: f64,
    pub hash_cpu_s: f64,
    /// Logical MB per CPU second, chunking alone and chunking + hashing.
    pub chunk_mb_per_cpu_s: Option<f64>,
    pub mb_per_cpu_s: f64,
    pub chunks_per_file: f64,
    /// Runs of contiguous storage a file is read back from, on average,
    /// with chunks stored in first-seen order: random reads per file.
    pub reads_per_file: f64,
    /// (upper bound of the size class in bytes, chunks).
    pub size_histogram: Vec<(u64, u64)>,
    /// Distinct chunks compressed one by one (not for WFH).
    pub compression: Vec<CompressionReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompressionReport {
    pub codec: Codec,
    /// Distinct bytes after compressing each distinct chunk.
    pub stored_bytes: u64,
    /// logical / stored: deduplication and compression together.
    pub fold_factor: f64,
    pub cpu_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub files: u64,
    pub bytes: u64,
    pub skipped: u64,
    pub first_skipped: Vec<String>,
    pub elapsed_s: f64,
    /// Stopped early: the numbers cover what was read.
    pub interrupted: bool,
    pub hash: String,
    pub index_entry_bytes: u64,
    pub recipe_entry_bytes: u64,
    /// The analyzer's own memory per distinct chunk, per algorithm.
    pub analyzer_bytes_per_chunk: u64,
    pub algorithms: Vec<AlgoReport>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn algo_report(a: &Algorithm, c: &Counts, codecs: &[Codec]) -> AlgoReport {
    let logical = c.logical_bytes as f64;
    let unique = c.unique_bytes as f64;
    let index_bytes = c.unique_chunks * INDEX_ENTRY_BYTES;
    let recipe_bytes = c.chunks * RECIPE_ENTRY_BYTES;
    let chunk_s = c.chunk_time.as_secs_f64();
    let cpu = chunk_s + c.hash_time.as_secs_f64();
    AlgoReport {
        algorithm: *a,
        label: a.label(),
        logical_bytes: c.logical_bytes,
        unique_bytes: c.unique_bytes,
        fold_factor: if c.unique_bytes == 0 {
            1.0
        } else {
            logical / unique
        },
        space_saved: if c.logical_bytes == 0 {
            0.0
        } else {
            1.0 - unique / logical
        },
        chunks: c.chunks,
        unique_chunks: c.unique_chunks,
        mean_chunk_bytes: ratio(logical, c.chunks as f64),
        zero_chunks: c.zero_chunks,
        zero_share: ratio(c.zero_bytes as f64, logical),
        index_bytes,
        recipe_bytes,
        metadata_share: ratio((index_bytes + recipe_bytes) as f64, unique),
        chunk_cpu_s: chunk_s,
        hash_cpu_s: c.hash_time.as_secs_f64(),
        chunk_mb_per_cpu_s: (chunk_s > 0.0).then(|| logical / 1e6 / chunk_s),
        mb_per_cpu_s: ratio(logical / 1e6, cpu),
        chunks_per_file: ratio(c.chunks as f64, c.files as f64),
        reads_per_file: ratio(c.reads as f64, c.files as f64),
        size_histogram: c
            .sizes
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (1u64 << k, n))
            .collect(),
        compression: if *a == Algorithm::Wfh {
            Vec::new()
        } else {
            codecs
                .iter()
                .enumerate()
                .map(|(k, &codec)| {
                    let (stored, t) = c.compressed.get(k).copied().unwrap_or_default();
                    CompressionReport {
                        codec,
                        stored_bytes: stored,
                        fold_factor: if stored == 0 {
                            1.0
                        } else {
                            logical / stored as f64
                        },
                        cpu_s: t.as_secs_f64(),
                    }
                })
                .collect()
        },
    }
}

pub fn report(a: &Analysis) -> Report {
    let t = a.totals();
    Report {
        files: t.files,
        bytes: t.bytes,
        skipped: t.skipped,
        first_skipped: t.first_skipped,
        elapsed_s: t.elapsed.as_secs_f64(),
        interrupted: t.interrupted,
        hash: format!("{:?}", a.hash).to_lowercase(),
        index_entry_bytes: INDEX_ENTRY_BYTES,
        recipe_entry_bytes: RECIPE_ENTRY_BYTES,
        analyzer_bytes_per_chunk: BYTES_PER_ENTRY,
        algorithms: a
            .algorithms
            .iter()
            .zip(a.counts())
            .map(|(al, c)| algo_report(al, &c, &a.codecs))
            .collect(),
    }
}

fn size(b: u64) -> String {
    dedup_core::size::format_size(b)
}

/// The table: the answer first (best fold factor and its cost), then one
/// row per algorithm.
pub fn table(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} files, {} read in {:.1} s{}{}",
        r.files,
        size(r.bytes),
        r.elapsed_s,
        if r.skipped > 0 {
            format!(", {} skipped (see below)", r.skipped)
        } else {
            String::new()
        },
        if r.interrupted {
            " — interrupted: the numbers cover what was read"
        } else {
            ""
        }
    );
    if let Some(best) = r
        .algorithms
        .iter()
        .max_by(|a, b| a.fold_factor.total_cmp(&b.fold_factor))
    {
        let _ = writeln!(
            o,
            "Best: {} folds {:.2}× ({} stored of {}, {:.1} % saved), for {} of index and {} of recipes and {:.1} CPU s",
            best.label,
            best.fold_factor,
            size(best.unique_bytes),
            size(best.logical_bytes),
            best.space_saved * 100.0,
            size(best.index_bytes),
            size(best.recipe_bytes),
            best.chunk_cpu_s + best.hash_cpu_s
        );
    }
    let _ = writeln!(
        o,
        "\n{:<14} {:>7} {:>8} {:>11} {:>11} {:>9} {:>10} {:>10} {:>6} {:>11} {:>9} {:>8}",
        "algorithm",
        "fold",
        "saved",
        "unique",
        "chunks",
        "mean",
        "index",
        "recipes",
        "zero",
        "chunk MB/s",
        "all MB/s",
        "reads/f"
    );
    for a in &r.algorithms {
        let _ = writeln!(
            o,
            "{:<14} {:>7.3} {:>7.1}% {:>11} {:>11} {:>9} {:>10} {:>10} {:>5.1}% {:>11} {:>9.0} {:>8.1}",
            a.label,
            a.fold_factor,
            a.space_saved * 100.0,
            size(a.unique_bytes),
            a.chunks,
            size(a.mean_chunk_bytes as u64),
            size(a.index_bytes),
            size(a.recipe_bytes),
            a.zero_share * 100.0,
            a.chunk_mb_per_cpu_s.map_or("-".into(), |v| format!("{v:.0}")),
            a.mb_per_cpu_s,
            a.reads_per_file
        );
    }
    if r.algorithms.iter().any(|a| !a.compression.is_empty()) {
        let _ = writeln!(o, "\nwith each distinct chunk compressed:");
        for a in r.algorithms.iter().filter(|a| !a.compression.is_empty()) {
            let parts: Vec<String> = a
                .compression
                .iter()
                .map(|c| {
                    format!(
                        "{} {} stored, fold {:.2}× ({:.1} CPU s)",
                        c.codec.name(),
                        size(c.stored_bytes),
                        c.fold_factor,
                        c.cpu_s
                    )
                })
                .collect();
            let _ = writeln!(o, "  {:<14} {}", a.label, parts.join("; "));
        }
    }
    let _ = writeln!(
        o,
        "\nindex entry {} B (32-byte {} fingerprint + 8-byte location), recipe entry {} B; MB/s per CPU second; reads/f: runs of contiguous storage per file.",
        r.index_entry_bytes, r.hash, r.recipe_entry_bytes
    );
    if !r.first_skipped.is_empty() {
        let _ = writeln!(o, "\nskipped:");
        for s in &r.first_skipped {
            let _ = writeln!(o, "  {s}");
        }
    }
    o
}

/// One CSV row per algorithm.
pub fn csv(r: &Report) -> String {
    let mut o = String::from(
        "algorithm,kind,nominal_bytes,logical_bytes,unique_bytes,fold_factor,space_saved,chunks,unique_chunks,mean_chunk_bytes,zero_share,index_bytes,recipe_bytes,metadata_share,chunk_cpu_s,hash_cpu_s,mb_per_cpu_s,chunks_per_file,reads_per_file\n",
    );
    for a in &r.algorithms {
        let kind = match a.algorithm {
            Algorithm::Wfh => "wfh",
            Algorithm::Fbh { .. } => "fbh",
            Algorithm::Rabin { .. } => "rabin",
            Algorithm::Fastcdc { .. } => "fastcdc",
        };
        let _ = writeln!(
            o,
            "{},{kind},{},{},{},{:.6},{:.6},{},{},{:.1},{:.6},{},{},{:.6},{:.4},{:.4},{:.1},{:.3},{:.3}",
            a.label,
            a.algorithm.nominal_size().map_or(String::new(), |s| s.to_string()),
            a.logical_bytes,
            a.unique_bytes,
            a.fold_factor,
            a.space_saved,
            a.chunks,
            a.unique_chunks,
            a.mean_chunk_bytes,
            a.zero_share,
            a.index_bytes,
            a.recipe_bytes,
            a.metadata_share,
            a.chunk_cpu_s,
            a.hash_cpu_s,
            a.mb_per_cpu_s,
            a.chunks_per_file,
            a.reads_per_file
        );
    }
    o
}
