//! A trace's statistics (Dmdedup Table 1's columns): reading a whole
//! trace for them, and their table. `dedup trace stats` shows them and
//! `dedup replay` reports them beside its run.

use std::fmt::Write as _;
use std::io::BufReader;
use std::path::Path;

use anyhow::{bail, Context};
use dedup_core::size::format_size;
use dedup_trace::stats::{StatsBuilder, TraceStats};
use dedup_trace::TraceReader;

/// Read a whole trace for its statistics (and the blocks a replay should
/// pre-fill). Malformed lines are reported on stderr.
pub fn measure(
    path: &Path,
    strict: bool,
    bar: Option<&indicatif::ProgressBar>,
) -> anyhow::Result<(TraceStats, Vec<u64>, u64)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        // The trace is read more than once (statistics, replay, verify).
        bail!(
            "{} is not a regular file: save the trace to a file first (a pipe can be read only once)",
            path.display()
        );
    }
    let len = meta.len();
    if let Some(bar) = bar {
        bar.set_length(len);
    }
    let input = BufReader::with_capacity(1 << 20, ProgressRead { inner: file, bar });
    let mut reader = TraceReader::new(input, strict);
    let mut b = StatsBuilder::default();
    for r in reader.by_ref() {
        let r = r.with_context(|| format!("in {}", path.display()))?;
        b.add(&r);
    }
    report_skipped(path, &reader);
    let stats = b.finish();
    if stats.requests == 0 {
        bail!("{} holds no requests", path.display());
    }
    Ok((stats, b.prefill_blocks().to_vec(), reader.skipped))
}

pub fn report_skipped<R: std::io::BufRead>(path: &Path, reader: &TraceReader<R>) {
    if reader.skipped > 0 {
        eprintln!(
            "dedup: skipped {} malformed line(s) of {} (--strict refuses them):",
            reader.skipped,
            path.display()
        );
        for s in &reader.first_skipped {
            eprintln!("  {s}");
        }
    }
}

/// Counts bytes read into a progress bar.
pub struct ProgressRead<'a, R> {
    pub inner: R,
    pub bar: Option<&'a indicatif::ProgressBar>,
}

impl<R: std::io::Read> std::io::Read for ProgressRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(bar) = self.bar {
            bar.inc(n as u64);
        }
        Ok(n)
    }
}

/// Dmdedup Table 1's columns for one trace.
pub fn table(s: &TraceStats) -> String {
    let mut out = String::new();
    let gib = |b: u64| format_size(b);
    let _ = writeln!(
        out,
        "requests {} ({} reads, {} writes, {} trims/zeroes, {} flushes) over {:.1} s",
        s.requests,
        s.reads,
        s.writes,
        s.trims + s.zeroes,
        s.flushes,
        s.duration_s
    );
    let _ = writeln!(
        out,
        "{:>12} {:>18} {:>18} {:>12} {:>8} {:>10} {:>12} {:>10}",
        "written",
        "unique (content)",
        "unique (offset)",
        "read",
        "dedup",
        "block",
        "accessed",
        "span"
    );
    let _ = writeln!(
        out,
        "{:>12} {:>18} {:>18} {:>12} {:>8.2} {:>10} {:>12} {:>10}",
        gib(s.written_bytes),
        gib(s.written_unique_by_content_bytes),
        gib(s.written_unique_by_offset_bytes),
        gib(s.read_bytes),
        s.dedup_ratio,
        s.block_size,
        gib(s.accessed_bytes),
        gib(s.span_bytes)
    );
    out
}
