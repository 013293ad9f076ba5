//! Command-line arguments more than one command takes, and the value
//! parsers behind them: sizes, `--index-memory`, compression, the backup
//! store's index options (`IndexArgs`), percentages.

use dedup_core::compress::Compression;
use dedup_store::index::{IndexConfig, SamplingRate};

/// clap value parser for sizes with K/M/G/T suffixes.
pub fn size_arg(s: &str) -> Result<u64, String> {
    dedup_core::size::parse_size(s).map_err(|e| e.to_string())
}

/// The smallest `--index-memory` the commands take: below it the index
/// holds next to nothing, and a bare number (bytes) is likely a slip.
const MIN_INDEX_MEMORY_ARG: u64 = 64 << 10;

pub fn index_memory_arg(s: &str) -> Result<u64, String> {
    let n = size_arg(s)?;
    if n < MIN_INDEX_MEMORY_ARG {
        return Err(format!(
            "{n} bytes is too small for the hash index: give at least {} KiB, e.g. 256M",
            MIN_INDEX_MEMORY_ARG >> 10
        ));
    }
    Ok(n)
}

/// clap value parser for a compression: zstd:LEVEL, zstd, lz4 or none.
pub fn compression_arg(s: &str) -> Result<Compression, String> {
    Compression::parse(s).map_err(|e| e.to_string())
}

/// How a writing command indexes the repository's segments.
#[derive(clap::Args, Clone, Debug)]
pub struct IndexArgs {
    /// RAM for the sampled index's hooks (Guo §3.2), at most 41 bytes a
    /// hook. Every fingerprint is a hook while they fit (the first 3.1 GiB
    /// stored, by default); past that the sampling rate halves as the
    /// store grows (R = 1, 1/2, 1/4, ...: 1/512 at 1 TiB), and a hit on a
    /// sampled fingerprint prefetches its container's catalog.
    #[arg(long, default_value = "32M", value_parser = index_memory_arg)]
    pub index_memory: u64,
    /// Fingerprints the prefetch cache holds, 24 bytes each (0: no
    /// prefetch). The default, 24 MiB, holds the catalogs of about 128
    /// containers of 4 KiB segments.
    #[arg(long, default_value_t = 1 << 20)]
    pub index_cache: usize,
    /// Sample at most this densely, whatever the budget allows: 1 (the
    /// budget decides), 1/2, 1/4, ... 1/128 ... (a power of two), to
    /// trade dedup for RAM as Guo's Table 4 does.
    #[arg(long, default_value = "1", value_parser = sampling_arg)]
    pub index_sampling: SamplingRate,
    /// Keep every fingerprint in RAM instead (about 60 bytes a segment),
    /// rebuilt from every catalog at open.
    #[arg(long)]
    pub exact_index: bool,
}

impl IndexArgs {
    pub fn config(&self) -> IndexConfig {
        IndexConfig {
            index_memory: self.index_memory,
            cache_entries: self.index_cache,
            max_rate: self.index_sampling,
            ..IndexConfig::default()
        }
    }
}

/// `1` or `1/T` for a power of two T.
fn sampling_arg(s: &str) -> Result<SamplingRate, String> {
    let period: u64 = match s.trim().strip_prefix("1/") {
        Some(t) => t
            .parse()
            .map_err(|_| format!("{s:?}: give 1 or 1/T, e.g. 1/16"))?,
        None if s.trim() == "1" => 1,
        None => return Err(format!("{s:?}: give 1 or 1/T, e.g. 1/16")),
    };
    if !period.is_power_of_two() {
        return Err(format!(
            "{s:?}: T must be a power of two (1/16, 1/128, ...)"
        ));
    }
    SamplingRate::from_log2_period(period.trailing_zeros())
        .ok_or_else(|| format!("{s:?}: too sparse"))
}

/// A percent from 0 to 100, `%` allowed (`dedup gc --compact-below`).
pub fn percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100")),
    }
}

/// A percent as `percent` takes it, for `store remote gc --compact-below`,
/// which took a fraction before: a bare number above 0 and at most 1
/// could mean either (0.5: half, or half a percent), so it is refused;
/// with a `%` it is a percent.
pub fn percent_not_fraction(s: &str) -> Result<f64, String> {
    let p = percent(s)?;
    if !s.ends_with('%') && p > 0.0 && p <= 1.0 {
        return Err(format!(
            "{s} is ambiguous: --compact-below takes a percent (as `dedup gc` does), no longer a fraction; write {} for {}, or {s}% for {s} percent",
            p * 100.0,
            s
        ));
    }
    Ok(p)
}
