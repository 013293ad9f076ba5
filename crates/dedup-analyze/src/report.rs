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
    /// Under `--sample`: the fold factor's bound (low, high), from the
    /// distinct bytes' estimate ± `unique_bytes_bound`.
    pub fold_factor_range: Option<[f64; 2]>,
    pub unique_bytes_bound: Option<u64>,
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
    /// Not known under `--sample`.
    pub reads_per_file: Option<f64>,
    /// (upper bound of the size class in bytes, chunks).
    pub size_histogram: Vec<(u64, u64)>,
    /// Distinct chunks compressed one by one (not for WFH).
    pub compression: Vec<CompressionReport>,
    /// With `--delta`: non-duplicate chunks delta-encoded against a
    /// similar stored chunk (not for WFH).
    pub delta: Option<DeltaReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeltaReport {
    /// Distinct chunks that resemble a stored chunk, and their bytes.
    pub similar_chunks: u64,
    pub similar_bytes: u64,
    /// Those chunks delta-encoded (zstd with the similar chunk as
    /// dictionary), and compressed by zstd alone for comparison.
    pub delta_bytes: u64,
    pub zstd_alone_bytes: u64,
    /// Matches lost because the base had left the bounded store.
    pub base_evicted: u64,
    /// Distinct bytes with the similar chunks stored as deltas.
    pub stored_bytes: u64,
    /// logical / stored: deduplication and delta together. The deltas are
    /// zstd-compressed, the other distinct chunks are not; so compare with
    /// `fold_factor_zstd_alone` (the similar chunks compressed by zstd
    /// without their base) to see what the base itself gains.
    pub fold_factor: f64,
    pub fold_factor_zstd_alone: f64,
    pub cpu_s: f64,
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
    /// Symbolic links inside directories, not followed.
    pub symlinks_not_followed: u64,
    pub elapsed_s: f64,
    /// Stopped early: the numbers cover what was read.
    pub interrupted: bool,
    pub hash: String,
    pub index_entry_bytes: u64,
    pub recipe_entry_bytes: u64,
    /// The analyzer's own memory per distinct chunk, per algorithm.
    pub analyzer_bytes_per_chunk: u64,
    /// 1 in this many distinct chunks indexed (1: exact).
    pub sample_rate: u64,
    /// Confidence of the sampling bounds.
    pub sample_confidence: f64,
    /// Set when too few distinct chunks were sampled for the bound to be
    /// trusted.
    pub sample_warning: Option<String>,
    pub algorithms: Vec<AlgoReport>,
}

/// Fewest sampled distinct chunks for the normal bound to hold.
pub const MIN_SAMPLED: u64 = 200;

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn fold(logical: f64, stored: f64) -> f64 {
    if stored > 0.0 {
        logical / stored
    } else {
        1.0
    }
}

fn algo_report(a: &Algorithm, c: &Counts, an: &Analysis) -> AlgoReport {
    let logical = c.logical_bytes as f64;
    // Under sampling, distinct counts are scaled up by the rate; the
    // bound says how far off that may be.
    let rate = an.sample.rate();
    let (unique, bound) = an.sample.estimate(c.unique_bytes, c.unique_sq);
    let unique_chunks = c.unique_chunks * rate;
    let index_bytes = unique_chunks * INDEX_ENTRY_BYTES;
    let recipe_bytes = c.chunks * RECIPE_ENTRY_BYTES;
    let chunk_s = c.chunk_time.as_secs_f64();
    let cpu = chunk_s + c.hash_time.as_secs_f64();
    let fold_factor = fold(logical, unique);
    AlgoReport {
        algorithm: *a,
        label: a.label(),
        logical_bytes: c.logical_bytes,
        unique_bytes: unique.round() as u64,
        fold_factor,
        // The distinct bytes are at least those sampled (known exactly)
        // and at most the logical bytes.
        fold_factor_range: an.sample.is_sampling().then(|| {
            let exact = c.unique_bytes as f64;
            [
                fold(logical, (unique + bound).min(logical).max(exact)),
                fold(logical, (unique - bound).max(exact).max(1.0)),
            ]
        }),
        unique_bytes_bound: an.sample.is_sampling().then_some(bound.round() as u64),
        space_saved: if c.logical_bytes == 0 {
            0.0
        } else {
            (1.0 - unique / logical).max(0.0)
        },
        chunks: c.chunks,
        unique_chunks,
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
        reads_per_file: (!an.sample.is_sampling()).then(|| ratio(c.reads as f64, c.files as f64)),
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
            an.codecs
                .iter()
                .enumerate()
                .map(|(k, &codec)| {
                    let (stored, t) = c.compressed.get(k).copied().unwrap_or_default();
                    let stored = stored * rate;
                    CompressionReport {
                        codec,
                        stored_bytes: stored,
                        fold_factor: fold(logical, stored as f64),
                        cpu_s: t.as_secs_f64(),
                    }
                })
                .collect()
        },
        delta: (an.measures_delta() && *a != Algorithm::Wfh && !an.sample.is_sampling()).then(
            || {
                let d = &c.delta;
                let others = c.unique_bytes.saturating_sub(d.similar_bytes);
                let stored = others + d.delta_bytes;
                DeltaReport {
                    similar_chunks: d.similar_chunks,
                    similar_bytes: d.similar_bytes,
                    delta_bytes: d.delta_bytes,
                    zstd_alone_bytes: d.alone_bytes,
                    base_evicted: d.base_evicted,
                    stored_bytes: stored,
                    fold_factor: fold(logical, stored as f64),
                    fold_factor_zstd_alone: fold(logical, (others + d.alone_bytes) as f64),
                    cpu_s: d.time.as_secs_f64(),
                }
            },
        ),
    }
}

pub fn report(a: &Analysis) -> Report {
    let t = a.totals();
    Report {
        files: t.files,
        bytes: t.bytes,
        skipped: t.skipped,
        first_skipped: t.first_skipped,
        symlinks_not_followed: t.symlinks,
        elapsed_s: t.elapsed.as_secs_f64(),
        interrupted: t.interrupted,
        hash: format!("{:?}", a.hash).to_lowercase(),
        index_entry_bytes: INDEX_ENTRY_BYTES,
        recipe_entry_bytes: RECIPE_ENTRY_BYTES,
        analyzer_bytes_per_chunk: BYTES_PER_ENTRY,
        sample_rate: a.sample.rate(),
        sample_confidence: 0.99,
        sample_warning: {
            let fewest = a
                .counts()
                .iter()
                .map(|c| c.unique_chunks)
                .min()
                .unwrap_or(0);
            (a.sample.is_sampling() && fewest < MIN_SAMPLED).then(|| {
                format!(
                    "only {fewest} distinct chunks were sampled (fewer than {MIN_SAMPLED}): the estimates and their bounds are unreliable; use a lower --sample rate"
                )
            })
        },
        algorithms: a
            .algorithms
            .iter()
            .zip(a.counts())
            .map(|(al, c)| algo_report(al, &c, a))
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
        "{} files, {} read in {:.1} s{}{}{}",
        r.files,
        size(r.bytes),
        r.elapsed_s,
        if r.skipped > 0 {
            format!(", {} skipped (see below)", r.skipped)
        } else {
            String::new()
        },
        if r.symlinks_not_followed > 0 {
            format!(", {} symbolic links not followed", r.symlinks_not_followed)
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
            "{:<14} {:>7.3} {:>7.1}% {:>11} {:>11} {:>9} {:>10} {:>10} {:>5.1}% {:>11} {:>9.0} {:>8}",
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
            a.reads_per_file.map_or("-".into(), |v| format!("{v:.1}"))
        );
    }
    if let Some(w) = &r.sample_warning {
        let _ = writeln!(o, "\nwarning: {w}");
    }
    if r.sample_rate > 1 {
        let _ = writeln!(
            o,
            "\nsampled 1 in {} distinct chunks by fingerprint; fold factor within ({:.0} % confidence):",
            r.sample_rate,
            r.sample_confidence * 100.0
        );
        for a in &r.algorithms {
            if let (Some([lo, hi]), Some(b)) = (a.fold_factor_range, a.unique_bytes_bound) {
                let _ = writeln!(
                    o,
                    "  {:<14} {:.3} to {:.3} (distinct bytes {} ± {})",
                    a.label,
                    lo,
                    hi,
                    size(a.unique_bytes),
                    size(b)
                );
            }
        }
    }
    if r.algorithms.iter().any(|a| a.delta.is_some()) {
        let _ = writeln!(
            o,
            "\nwith chunks similar to a stored chunk delta-encoded (zstd, the similar chunk as dictionary):"
        );
        for a in &r.algorithms {
            let Some(d) = &a.delta else { continue };
            let _ = writeln!(
                o,
                "  {:<14} {} similar chunks ({}) → {} as deltas ({} by zstd alone); fold {:.2}× ({:.2}× with zstd alone); {:.1} CPU s{}",
                a.label,
                d.similar_chunks,
                size(d.similar_bytes),
                size(d.delta_bytes),
                size(d.zstd_alone_bytes),
                d.fold_factor,
                d.fold_factor_zstd_alone,
                d.cpu_s,
                if d.base_evicted > 0 {
                    format!("; {} matches lost to the memory bound (raise --delta-memory)", d.base_evicted)
                } else {
                    String::new()
                }
            );
        }
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

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.6}"))
}

/// One CSV row per algorithm.
pub fn csv(r: &Report) -> String {
    let mut o = String::from(
        "algorithm,kind,nominal_bytes,logical_bytes,unique_bytes,fold_factor,space_saved,chunks,unique_chunks,mean_chunk_bytes,zero_share,index_bytes,recipe_bytes,metadata_share,chunk_cpu_s,hash_cpu_s,mb_per_cpu_s,chunks_per_file,reads_per_file,fold_low,fold_high,delta_fold_factor,delta_similar_bytes,delta_bytes\n",
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
            "{},{kind},{},{},{},{:.6},{:.6},{},{},{:.1},{:.6},{},{},{:.6},{:.4},{:.4},{:.1},{:.3},{},{},{},{},{},{}",
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
            opt(a.reads_per_file),
            opt(a.fold_factor_range.map(|r| r[0])),
            opt(a.fold_factor_range.map(|r| r[1])),
            opt(a.delta.as_ref().map(|d| d.fold_factor)),
            a.delta.as_ref().map_or(String::new(), |d| d.similar_bytes.to_string()),
            a.delta.as_ref().map_or(String::new(), |d| d.delta_bytes.to_string()),
        );
    }
    o
}
