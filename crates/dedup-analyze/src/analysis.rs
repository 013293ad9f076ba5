//! Reading the inputs once and feeding every algorithm: directories are
//! walked (symlinks not followed), files are read by several threads, and
//! each algorithm counts its chunks, distinct chunks, zero chunks, chunk
//! sizes, CPU time, and how many runs of contiguous storage each file
//! would be read back from.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_core::fingerprint::HashAlgo;

use crate::algo::Algorithm;
use crate::chunker::{Chunker, Piece};
use crate::delta::{DeltaCounts, Resemblance};
use crate::index::Index;
use crate::rabin;
use crate::sample::Sampling;

const READ_SIZE: usize = 1 << 20;
/// Skipped inputs named in the report (the count covers all).
const KEEP_SKIPPED: usize = 50;

/// Counts for one algorithm, summed over files and threads.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub logical_bytes: u64,
    pub chunks: u64,
    pub unique_chunks: u64,
    pub unique_bytes: u64,
    pub zero_chunks: u64,
    pub zero_bytes: u64,
    pub chunk_time: Duration,
    pub hash_time: Duration,
    /// Chunks per power-of-two size class: `sizes[k]` counts chunks of
    /// 2^(k-1) < len ≤ 2^k bytes.
    pub sizes: Vec<u64>,
    /// Sum over files of the runs of contiguous storage they would be read
    /// back from (chunks stored in first-seen order).
    pub reads: u64,
    pub files: u64,
    /// Per `Analysis::codecs`: distinct chunks' bytes after compression,
    /// and the time it took.
    pub compressed: Vec<(u64, Duration)>,
    /// Σ size² of the distinct chunks counted, for the sampling bound.
    pub unique_sq: f64,
    pub delta: DeltaCounts,
}

impl Counts {
    fn merge(&mut self, o: &Counts) {
        self.logical_bytes += o.logical_bytes;
        self.chunks += o.chunks;
        self.unique_chunks += o.unique_chunks;
        self.unique_bytes += o.unique_bytes;
        self.zero_chunks += o.zero_chunks;
        self.zero_bytes += o.zero_bytes;
        self.chunk_time += o.chunk_time;
        self.hash_time += o.hash_time;
        if self.sizes.len() < o.sizes.len() {
            self.sizes.resize(o.sizes.len(), 0);
        }
        for (a, b) in self.sizes.iter_mut().zip(&o.sizes) {
            *a += b;
        }
        self.reads += o.reads;
        self.files += o.files;
        if self.compressed.len() < o.compressed.len() {
            self.compressed
                .resize(o.compressed.len(), (0, Duration::ZERO));
        }
        for (a, b) in self.compressed.iter_mut().zip(&o.compressed) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.unique_sq += o.unique_sq;
        self.delta.merge(&o.delta);
    }
}

/// What was read, and what was not.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub files: u64,
    pub bytes: u64,
    pub skipped: u64,
    pub first_skipped: Vec<String>,
    pub elapsed: Duration,
    /// Stopped early (Ctrl-C): the counts cover what was read.
    pub interrupted: bool,
    /// Symbolic links inside directories, not followed.
    pub symlinks: u64,
}

/// A compressor applied to each distinct chunk, to show deduplication and
/// compression together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    Lz4,
    /// zstd at level 3 (its default).
    Zstd,
}

impl Codec {
    pub fn parse(s: &str) -> Result<Codec, String> {
        match s {
            "lz4" => Ok(Codec::Lz4),
            "zstd" => Ok(Codec::Zstd),
            _ => Err(format!("unknown compression `{s}`: use lz4 or zstd")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Compressed size (never more than the chunk: an incompressible
    /// chunk would be stored as it is).
    fn size(self, chunk: &[u8]) -> u64 {
        let n = match self {
            Codec::Lz4 => lz4_flex::block::compress(chunk).len(),
            Codec::Zstd => zstd::bulk::compress(chunk, 3).map_or(chunk.len(), |c| c.len()),
        };
        n.min(chunk.len()) as u64
    }
}

pub struct Analysis {
    pub algorithms: Vec<Algorithm>,
    pub hash: HashAlgo,
    /// Compressors applied to distinct chunks (not WFH's whole files).
    pub codecs: Vec<Codec>,
    /// 1 in `rate` distinct chunks indexed (content-based).
    pub sample: Sampling,
    /// Per algorithm, when delta compression is measured (None for WFH).
    delta: Vec<Option<Resemblance>>,
    indexes: Vec<Index>,
    counts: Mutex<Vec<Counts>>,
    totals: Mutex<Totals>,
    /// Bytes read so far (for progress).
    pub bytes_read: AtomicU64,
    pub files_read: AtomicU64,
    /// Set to stop early; what was read so far is still reported.
    pub stop: AtomicBool,
    tables: Arc<rabin::Tables>,
}

impl Analysis {
    pub fn new(algorithms: Vec<Algorithm>, hash: HashAlgo) -> Analysis {
        let n = algorithms.len();
        Analysis {
            indexes: (0..n).map(|_| Index::default()).collect(),
            counts: Mutex::new(vec![Counts::default(); n]),
            totals: Mutex::new(Totals::default()),
            algorithms,
            hash,
            codecs: Vec::new(),
            sample: Sampling::default(),
            delta: Vec::new(),
            bytes_read: AtomicU64::new(0),
            files_read: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            tables: Arc::new(rabin::Tables::new()),
        }
    }

    /// Measure delta compression of non-duplicate chunks against similar
    /// stored ones, keeping at most `memory` bytes of bases in all.
    pub fn measure_delta(&mut self, memory: u64) {
        let n = self
            .algorithms
            .iter()
            .filter(|a| **a != Algorithm::Wfh)
            .count();
        let each = memory / n.max(1) as u64;
        self.delta = self
            .algorithms
            .iter()
            .map(|a| (*a != Algorithm::Wfh).then(|| Resemblance::new(each)))
            .collect();
    }

    pub fn measures_delta(&self) -> bool {
        !self.delta.is_empty()
    }

    /// Links the walk left alone, for the report.
    pub fn note_symlinks(&self, n: u64) {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .symlinks += n;
    }

    pub fn skip(&self, what: &Path, why: String) {
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.skipped += 1;
        if t.first_skipped.len() < KEEP_SKIPPED {
            t.first_skipped.push(format!("{}: {why}", what.display()));
        }
    }

    /// Analyse `files` with `threads` readers.
    pub fn run(&self, files: &[PathBuf], threads: usize) {
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(|| {
                    let mut local = vec![Counts::default(); self.algorithms.len()];
                    let mut bufs = Buffers::default();
                    loop {
                        if self.stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = files.get(i) else { break };
                        if let Err(why) = self.file(path, &mut local, &mut bufs) {
                            self.skip(path, why);
                        }
                    }
                    let mut all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                    for (a, l) in all.iter_mut().zip(&local) {
                        a.merge(l);
                    }
                });
            }
        });
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.elapsed += started.elapsed();
        t.interrupted |= self.stop.load(Ordering::Relaxed);
    }

    /// Read one file through every algorithm.
    fn file(&self, path: &Path, local: &mut [Counts], bufs: &mut Buffers) -> Result<(), String> {
        let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let before = input_len(&mut f).map_err(|e| e.to_string())?;
        let len = self.stream(&mut f, local, bufs)?;
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.files += 1;
        t.bytes += len;
        drop(t);
        if len != before && !self.stop.load(Ordering::Relaxed) {
            self.skip(
                path,
                format!(
                    "changed while read ({before} bytes at the start, {len} read); counted as read"
                ),
            );
        }
        Ok(())
    }

    /// Analyse a tar stream: each regular file in it as a file. A stream
    /// that ends early or is damaged stops there, reported; what was read
    /// is counted.
    pub fn run_tar(&self, name: &Path, input: impl Read) {
        let started = Instant::now();
        let mut local = vec![Counts::default(); self.algorithms.len()];
        let mut bufs = Buffers::default();
        let mut archive = tar::Archive::new(input);
        let mut entries_read = 0u64;
        let result = (|| -> Result<(), String> {
            let entries = archive.entries().map_err(|e| e.to_string())?;
            for entry in entries {
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut entry = entry.map_err(|e| e.to_string())?;
                entries_read += 1;
                // Sparse members read back expanded, as the file they hold.
                if !matches!(
                    entry.header().entry_type(),
                    tar::EntryType::Regular
                        | tar::EntryType::GNUSparse
                        | tar::EntryType::Continuous
                ) {
                    continue;
                }
                let want = entry.size();
                let len = self.stream(&mut entry, &mut local, &mut bufs)?;
                let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
                t.files += 1;
                t.bytes += len;
                drop(t);
                if len != want {
                    return Err(format!("a member ends after {len} of its {want} bytes"));
                }
            }
            Ok(())
        })();
        if let Err(why) = result {
            self.skip(
                name,
                format!("tar stream stopped after {entries_read} entries: {why} (the stream ended early or is damaged)"),
            );
        }
        let mut all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for (a, l) in all.iter_mut().zip(&local) {
            a.merge(l);
        }
        drop(all);
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.elapsed += started.elapsed();
        t.interrupted |= self.stop.load(Ordering::Relaxed);
    }

    /// Read one file's bytes through every algorithm; returns its length.
    fn stream(
        &self,
        f: &mut dyn Read,
        local: &mut [Counts],
        bufs: &mut Buffers,
    ) -> Result<u64, String> {
        let Buffers(buf, next) = bufs;
        let mut chunkers: Vec<Chunker> = self
            .algorithms
            .iter()
            .map(|a| Chunker::new(a, &self.tables))
            .collect();
        // Per algorithm: where the previous chunk is stored, for runs.
        let mut last: Vec<Option<u64>> = vec![None; chunkers.len()];
        let mut runs = vec![0u64; chunkers.len()];
        let mut len = 0u64;
        let mut filled = read_full(f, buf).map_err(|e| e.to_string())?;
        loop {
            // Read ahead one block to know whether this one is the last.
            let next_len = if filled == READ_SIZE {
                read_full(f, next).map_err(|e| e.to_string())?
            } else {
                0
            };
            let eof = next_len == 0;
            let data = &buf[..filled];
            len += filled as u64;
            for (k, c) in chunkers.iter_mut().enumerate() {
                let counts = &mut local[k];
                let index = &self.indexes[k];
                // Time spent in emit on compression and delta, which are
                // booked apart: the rest of feed() is chunking and hashing.
                let mut extra = Duration::ZERO;
                let mut emit = |p: Piece| {
                    let (key, n, zero, bytes) = match p {
                        Piece::Bytes(b) => {
                            let fp = self.hash.fingerprint(b);
                            let key = u128::from_le_bytes(fp.0[..16].try_into().expect("16"));
                            (key, b.len() as u64, dedup_core::engine::is_zero(b), Some(b))
                        }
                        Piece::Hashed(h, n) => (
                            u128::from_le_bytes(h[..16].try_into().expect("16")),
                            n,
                            false,
                            None,
                        ),
                    };
                    let sampled = self.sample.keeps(key);
                    let (new, at) = if sampled {
                        index.insert(key)
                    } else {
                        (false, 0)
                    };
                    let extras =
                        !self.codecs.is_empty() || self.delta.get(k).is_some_and(|d| d.is_some());
                    if let (true, true, Some(b)) = (extras, new, bytes) {
                        let t_extra = crate::cpu::now();
                        if let Some(Some(r)) = self.delta.get(k) {
                            r.add(b, &mut counts.delta);
                        }
                        if counts.compressed.len() < self.codecs.len() {
                            counts
                                .compressed
                                .resize(self.codecs.len(), (0, Duration::ZERO));
                        }
                        for (c, slot) in self.codecs.iter().zip(counts.compressed.iter_mut()) {
                            let (n, t) = crate::cpu::time(|| c.size(b));
                            slot.0 += n;
                            slot.1 += t;
                        }
                        extra += crate::cpu::now().saturating_sub(t_extra);
                    }
                    counts.chunks += 1;
                    counts.logical_bytes += n;
                    if new {
                        counts.unique_chunks += 1;
                        counts.unique_bytes += n;
                        counts.unique_sq += (n as f64) * (n as f64);
                    }
                    if zero {
                        counts.zero_chunks += 1;
                        counts.zero_bytes += n;
                    }
                    let class = 64 - n.max(1).saturating_sub(1).leading_zeros() as usize;
                    if counts.sizes.len() <= class {
                        counts.sizes.resize(class + 1, 0);
                    }
                    counts.sizes[class] += 1;
                    // Where unsampled chunks are stored is unknown.
                    if sampled && last[k].is_none_or(|l| l + 1 != at) {
                        runs[k] += 1;
                    }
                    last[k] = Some(at);
                };
                // Clocks are read per feed, not per chunk: at 4 KiB chunks
                // two clock reads per chunk cost a tenth of the hashing.
                // CPU time of this thread, not wall time: readers may
                // outnumber cores.
                let t_feed = crate::cpu::now();
                let chunking = c.feed(data, eof, &mut emit);
                let total = crate::cpu::now()
                    .saturating_sub(t_feed)
                    .saturating_sub(extra);
                if matches!(c, Chunker::Whole(..)) {
                    local[k].hash_time += total;
                } else {
                    local[k].chunk_time += chunking;
                    local[k].hash_time += total.saturating_sub(chunking);
                }
            }
            self.bytes_read.fetch_add(filled as u64, Ordering::Relaxed);
            // Ctrl-C: stop inside a large file too (its chunks found so
            // far are counted, the unfinished one is not).
            if eof || self.stop.load(Ordering::Relaxed) {
                break;
            }
            std::mem::swap(buf, next);
            filled = next_len;
        }
        for (k, r) in runs.iter().enumerate() {
            local[k].reads += r;
            local[k].files += 1;
        }
        self.files_read.fetch_add(1, Ordering::Relaxed);
        Ok(len)
    }

    pub fn counts(&self) -> Vec<Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn totals(&self) -> Totals {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Distinct chunks held in memory across all algorithms.
    pub fn index_entries(&self) -> u64 {
        self.indexes.iter().map(|i| i.len()).sum()
    }
}

/// A reader's two read buffers (the current block and the one read ahead
/// to know whether it is the last), allocated once: a fresh zeroed 1 MiB
/// per file cost more than hashing it.
struct Buffers(Vec<u8>, Vec<u8>);

impl Default for Buffers {
    fn default() -> Self {
        Buffers(vec![0; READ_SIZE], vec![0; READ_SIZE])
    }
}

/// Bytes in a file or block device (whose metadata says 0).
pub fn input_len(f: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let m = f.metadata()?;
    if m.is_file() {
        return Ok(m.len());
    }
    let n = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(n)
}

/// Fill `buf` as far as the file allows.
fn read_full(f: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
