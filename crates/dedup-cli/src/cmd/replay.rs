//! `dedup replay TRACE DIR`: replay a block trace (FIU or dedup's own
//! format) against a device, with many requests in flight, optionally
//! against a raw file in the same run, and report as `bench` does plus the
//! trace's own statistics (Dmdedup §4.2.2).

use std::collections::HashMap;
use std::io::BufReader;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use dedup_core::layout::{self, DevicePaths};
use dedup_core::size::format_size;
use dedup_core::{Device, OpenOptions};
use dedup_trace::replay::{self, Options, Report, Target};
use dedup_trace::stats::TraceStats;
use dedup_trace::{content, Op, Request, TraceReader, BLOCK};
use serde::Serialize;

use super::shared::progress::bytes_bar;
use super::shared::report::print_json;
use super::shared::trace_stats::{measure, table};

#[derive(clap::Args)]
#[command(
    about = "Replay a block trace (FIU/SNIA IOTTA or `dedup serve --record` format) against a device",
    after_help = "Content is generated from each request's hash, so equal hashes give equal blocks.\n\
        The device must be stopped (replay opens it here).\n\nExamples:\n  dedup trace gen web.trace --preset web --size 1G\n  dedup replay web.trace ./dev --baseline\n  dedup replay homes.blkparse ./dev --wrap --json"
)]
pub struct Args {
    pub trace: PathBuf,
    /// A device directory made by `dedup create`.
    pub dir: PathBuf,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 32)]
    pub depth: usize,
    /// Issue each request at its trace time instead of as fast as possible.
    #[arg(long)]
    pub timing: bool,
    /// Fold offsets beyond the device back into it instead of refusing.
    #[arg(long)]
    pub wrap: bool,
    /// Refuse the trace at its first malformed line (default: skip and count).
    #[arg(long)]
    pub strict: bool,
    /// Before replaying, write content to the blocks the trace reads before
    /// writing, so those reads do I/O on every system (as Dmdedup did).
    #[arg(long)]
    pub prefill: bool,
    /// Also replay against a raw file of the same size in DIR's filesystem
    /// (the baseline, pread/pwrite like nbdkit's file plugin), first.
    #[arg(long)]
    pub baseline: bool,
    /// After replaying, read back every block the trace wrote and compare
    /// with what the trace implies (memory: ~40 bytes per block written
    /// whole, 4 KiB per block written in part).
    #[arg(long)]
    pub verify: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct ReplayOutput {
    trace: TraceStats,
    skipped_lines: u64,
    backend: String,
    device: Report,
    /// The device after the replay (pre-filled blocks included).
    dedup_ratio: f64,
    /// Bytes the replay wrote / bytes it made the device write (the
    /// pre-fill and --verify excluded).
    io_dedup_ratio: f64,
    /// Metadata I/O during the replay alone.
    metadata_reads: u64,
    metadata_writes: u64,
    metadata_syncs: u64,
    metadata_bytes_written: u64,
    /// CPU seconds of this process during the device replay (replayer and
    /// device together: the device runs in-process).
    cpu_seconds: f64,
    baseline: Option<Report>,
    /// Device throughput / raw throughput.
    ratio_to_raw: Option<f64>,
    /// Blocks read back and found as the trace implies (--verify).
    verified_blocks: Option<u64>,
}

fn count_bar(msg: String, len: u64) -> anyhow::Result<indicatif::ProgressBar> {
    Ok(indicatif::ProgressBar::new(len)
        .with_message(msg)
        .with_style(
            indicatif::ProgressStyle::with_template(
                "{msg:24} [{bar:30}] {pos}/{len} requests {per_sec}, {eta} left",
            )?
            .progress_chars("=> "),
        ))
}

struct DeviceTarget(Device);

impl Target for DeviceTarget {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.0.read(offset, buf).map_err(|e| e.to_string())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), String> {
        self.0.write(offset, data, fua).map_err(|e| e.to_string())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), String> {
        self.0.discard(offset, len, fua).map_err(|e| e.to_string())
    }
    fn zero(&self, offset: u64, len: u64, fua: bool) -> Result<(), String> {
        self.0
            .write_zeroes(offset, len, fua)
            .map_err(|e| e.to_string())
    }
    fn flush(&self) -> Result<(), String> {
        self.0.flush().map_err(|e| e.to_string())
    }
}

/// The raw baseline: a sparse file, written and read in place, synced on
/// flush and FUA (what nbdkit's file plugin does).
struct RawTarget {
    file: std::fs::File,
    size: u64,
}

impl RawTarget {
    fn punch(&self, offset: u64, len: u64) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        // No hole punching here: write the zeros.
        self.file
            .write_all_at(&vec![0u8; len as usize], offset)
            .map_err(|e| e.to_string())
    }
    fn sync_if(&self, fua: bool) -> Result<(), String> {
        if fua {
            self.file.sync_data().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Target for RawTarget {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| e.to_string())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), String> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| e.to_string())?;
        self.sync_if(fua)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), String> {
        self.punch(offset, len)?;
        self.sync_if(fua)
    }
    fn zero(&self, offset: u64, len: u64, fua: bool) -> Result<(), String> {
        self.trim(offset, len, fua)
    }
    fn flush(&self) -> Result<(), String> {
        self.file.sync_data().map_err(|e| e.to_string())
    }
}

fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The content pre-filled into block `b`: its own seed, so reads of it
/// cost I/O but it deduplicates with nothing the trace writes.
fn prefill_seed(b: u64) -> dedup_trace::Seed {
    content::seed_of(&[b"dedup-prefill".as_slice(), &b.to_le_bytes()].concat())
}

fn prefill(target: &dyn Target, blocks: &[u64], wrap: bool) -> anyhow::Result<()> {
    let usable = target.size() - target.size() % BLOCK;
    let mut buf = vec![0u8; BLOCK as usize];
    for &b in blocks {
        let mut off = b * BLOCK;
        if off + BLOCK > usable {
            if !wrap {
                continue;
            }
            off %= usable;
        }
        content::fill(&prefill_seed(b), &mut buf);
        target.write(off, &buf, false).map_err(anyhow::Error::msg)?;
    }
    target.flush().map_err(anyhow::Error::msg)
}

/// Pre-fill (if asked), not timed.
fn prepare(
    a: &Args,
    label: &str,
    target: &dyn Target,
    prefill_blocks: &[u64],
) -> anyhow::Result<()> {
    if a.prefill && !prefill_blocks.is_empty() {
        prefill(target, prefill_blocks, a.wrap).with_context(|| format!("pre-filling {label}"))?;
    }
    Ok(())
}

/// Replay the whole trace on `target`; `requests` is what the first pass
/// counted, and the replay must see the same.
fn run_one(
    a: &Args,
    label: &str,
    target: Arc<dyn Target>,
    requests: u64,
) -> anyhow::Result<Report> {
    let file = std::fs::File::open(&a.trace)?;
    let mut reader = TraceReader::new(BufReader::with_capacity(1 << 20, file), a.strict);
    let bar = count_bar(format!("replaying on {label}"), requests)?;
    let opts = Options {
        depth: a.depth,
        timing: a.timing,
        wrap: a.wrap,
    };
    let report = replay::replay(reader.by_ref(), target, &opts, &|n| bar.set_position(n))
        .with_context(|| format!("replaying {} on {label}", a.trace.display()))?;
    bar.finish_and_clear();
    if report.requests != requests {
        bail!(
            "{} gave {} requests on the first reading and {} on the second: was it changed meanwhile?",
            a.trace.display(),
            requests,
            report.requests
        );
    }
    Ok(report)
}

/// What a block should hold after the replay (--verify).
#[derive(Clone)]
enum Want {
    Seed(Option<dedup_trace::Seed>),
    Bytes(Box<[u8]>),
}

/// Read back every block the trace (and the pre-fill) wrote.
fn verify(a: &Args, target: &dyn Target, prefill_blocks: &[u64]) -> anyhow::Result<u64> {
    let usable = target.size() - target.size() % BLOCK;
    let mut want: HashMap<u64, Want> = HashMap::new();
    if a.prefill {
        for &b in prefill_blocks {
            if b * BLOCK + BLOCK <= usable || a.wrap {
                want.insert(
                    (b * BLOCK % usable) / BLOCK,
                    Want::Seed(Some(prefill_seed(b))),
                );
            }
        }
    }
    let file = std::fs::File::open(&a.trace)?;
    let mut reader = TraceReader::new(BufReader::with_capacity(1 << 20, file), a.strict);
    for r in reader.by_ref() {
        let mut r: Request = r?;
        if r.op == Op::Flush || r.op == Op::Read {
            continue;
        }
        if r.end() > usable {
            r.offset = replay::wrap_offset(r.offset, r.len, usable);
        }
        let bytes = replay::write_buffer(&r);
        let seeds = r.block_seeds();
        let mut at = 0usize;
        for (i, b) in r.blocks().enumerate() {
            let start = (b * BLOCK).max(r.offset);
            let end = ((b + 1) * BLOCK).min(r.end());
            let piece = (end - start) as usize;
            let whole = piece as u64 == BLOCK;
            let new_bytes: &[u8] = if r.op == Op::Write {
                &bytes[at..at + piece]
            } else {
                &[]
            };
            if whole {
                let seed = if r.op == Op::Write { seeds[i] } else { None };
                want.insert(b, Want::Seed(seed));
            } else {
                let mut cur = match want.get(&b) {
                    Some(Want::Bytes(v)) => v.to_vec(),
                    Some(Want::Seed(Some(s))) => {
                        let mut v = vec![0u8; BLOCK as usize];
                        content::fill(s, &mut v);
                        v
                    }
                    _ => vec![0u8; BLOCK as usize],
                };
                let lo = (start - b * BLOCK) as usize;
                if r.op == Op::Write {
                    cur[lo..lo + piece].copy_from_slice(new_bytes);
                } else {
                    cur[lo..lo + piece].fill(0);
                }
                want.insert(b, Want::Bytes(cur.into_boxed_slice()));
            }
            at += piece;
        }
    }
    let mut got = vec![0u8; BLOCK as usize];
    let mut expect = vec![0u8; BLOCK as usize];
    let mut blocks: Vec<&u64> = want.keys().collect();
    blocks.sort_unstable();
    for &b in blocks {
        target
            .read(b * BLOCK, &mut got)
            .map_err(anyhow::Error::msg)?;
        match &want[&b] {
            Want::Seed(None) => expect.fill(0),
            Want::Seed(Some(s)) => content::fill(s, &mut expect),
            Want::Bytes(v) => expect.copy_from_slice(v),
        }
        if got != expect {
            bail!(
                "block {b} (byte {}) does not hold what the trace wrote there",
                b * BLOCK
            );
        }
    }
    Ok(want.len() as u64)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let bar = bytes_bar("reading the trace")?;
    let (stats, prefill_blocks, skipped) = measure(&a.trace, a.strict, Some(&bar))?;
    bar.finish_and_clear();

    let paths = DevicePaths::from_dir(&a.dir)?;
    let device = layout::open(
        &paths,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .with_context(|| format!("opening {} (replay needs it stopped)", a.dir.display()))?;
    let target = Arc::new(DeviceTarget(device));
    // Whatever happens, close the device: an INRAM device left open would
    // refuse to open again.
    let result = replay_all(&a, &target, stats, &prefill_blocks, skipped);
    let closed = target.0.close();
    let out = result?;
    closed?;
    if a.json {
        print_json(&out)?;
    } else {
        out!("{}", render(&out, &a.trace));
    }
    Ok(ExitCode::SUCCESS)
}

fn replay_all(
    a: &Args,
    target: &Arc<DeviceTarget>,
    stats: TraceStats,
    prefill_blocks: &[u64],
    skipped: u64,
) -> anyhow::Result<ReplayOutput> {
    let size = target.size();
    if stats.span_bytes > size && !a.wrap {
        bail!(
            "the trace reaches byte {} ({}) but {} is {}: create a device with --size {} or more, or pass --wrap",
            stats.span_bytes,
            format_size(stats.span_bytes),
            a.dir.display(),
            format_size(size),
            stats.span_bytes.div_ceil(1 << 20) * (1 << 20)
        );
    }
    let backend = target.0.config().backend.clone();

    let baseline = if a.baseline {
        let raw_path = a.dir.join("replay-baseline.raw");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&raw_path)
            .with_context(|| format!("creating {}", raw_path.display()))?;
        let raw = Arc::new(RawTarget { file, size });
        let result = raw
            .file
            .set_len(size)
            .map_err(anyhow::Error::from)
            .and_then(|_| prepare(a, "raw", raw.as_ref(), prefill_blocks))
            .and_then(|_| run_one(a, "raw", raw.clone(), stats.requests));
        let _ = std::fs::remove_file(&raw_path);
        Some(result?)
    } else {
        None
    };

    prepare(a, &backend, target.as_ref(), prefill_blocks)?;
    let before = target.0.stats();
    let cpu0 = cpu_seconds();
    let rep = run_one(a, &backend, target.clone(), stats.requests)?;
    let cpu = cpu_seconds() - cpu0;
    let after = target.0.stats();
    let verified = if a.verify {
        Some(verify(a, target.as_ref(), prefill_blocks)?)
    } else {
        None
    };

    let out = ReplayOutput {
        ratio_to_raw: baseline
            .as_ref()
            .map(|b| rep.mb_per_s / b.mb_per_s.max(1e-9)),
        trace: stats,
        skipped_lines: skipped,
        backend,
        device: rep,
        dedup_ratio: after.dedup_ratio,
        io_dedup_ratio: {
            let client = after.counters.bytes_written - before.counters.bytes_written;
            let data = after.counters.data_bytes_written - before.counters.data_bytes_written;
            if data == 0 {
                1.0
            } else {
                client as f64 / data as f64
            }
        },
        metadata_reads: after
            .metadata_io
            .reads
            .saturating_sub(before.metadata_io.reads),
        metadata_writes: after
            .metadata_io
            .writes
            .saturating_sub(before.metadata_io.writes),
        metadata_syncs: after
            .metadata_io
            .syncs
            .saturating_sub(before.metadata_io.syncs),
        metadata_bytes_written: after
            .metadata_io
            .bytes_written
            .saturating_sub(before.metadata_io.bytes_written),
        cpu_seconds: cpu,
        baseline,
        verified_blocks: verified,
    };
    Ok(out)
}

fn render(o: &ReplayOutput, trace: &Path) -> String {
    use std::fmt::Write;
    let mut s = format!("trace {}\n{}\n", trace.display(), table(&o.trace));
    let _ = writeln!(
        s,
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "system", "MB/s", "IOPS", "p50 µs", "p99 µs", "p99.9 µs", "×raw"
    );
    let row = |s: &mut String, name: &str, r: &Report, ratio: Option<f64>| {
        let _ = writeln!(
            s,
            "{:<12} {:>10.1} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            name,
            r.mb_per_s,
            r.iops,
            r.lat_p50_us,
            r.lat_p99_us,
            r.lat_p999_us,
            ratio.map_or("".into(), |x| format!("{x:.2}"))
        );
    };
    if let Some(b) = &o.baseline {
        row(&mut s, "raw", b, Some(1.0));
    }
    row(&mut s, &o.backend, &o.device, o.ratio_to_raw);
    let _ = writeln!(
        s,
        "\n{}: dedup ratio {:.2}, I/O dedup ratio {:.2}, metadata {} reads / {} writes / {} syncs ({} written), CPU {:.1} s",
        o.backend,
        o.dedup_ratio,
        o.io_dedup_ratio,
        o.metadata_reads,
        o.metadata_writes,
        o.metadata_syncs,
        format_size(o.metadata_bytes_written),
        o.cpu_seconds
    );
    if o.device.wrapped > 0 {
        let _ = writeln!(
            s,
            "{} requests wrapped into the device (--wrap)",
            o.device.wrapped
        );
    }
    if let Some(v) = o.verified_blocks {
        let _ = writeln!(
            s,
            "verified: all {v} written blocks read back as the trace implies"
        );
    }
    s
}
