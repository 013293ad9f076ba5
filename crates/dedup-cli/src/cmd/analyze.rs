//! `dedup analyze PATH...`: how much would deduplication save on this
//! data, with which chunking, at what cost (library: dedup-analyze).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use dedup_analyze::{report, Algorithm, Analysis, Codec};
use dedup_core::fingerprint::HashAlgo;

use super::shared::report::print_json;

#[derive(clap::Args)]
#[command(
    about = "Estimate what deduplication would save on files or directories, per chunking algorithm",
    after_help = "Algorithms: wfh (whole files), fbh:SIZE (fixed blocks), rabin:AVG[:MIN:MAX] and\n\
        fastcdc:AVG[:MIN:MAX] (content-defined; min = avg/2, max = 2 avg by default).\n\
        Sizes 4K to 1M, powers of two. Ctrl-C stops and reports what was read.\n\n\
        Examples:\n  dedup analyze ~/src\n  tar -c ~/src | dedup analyze --tar -\n  dedup analyze /srv/vm-images --algorithms fbh:4k,fastcdc:8k --json\n  dedup analyze disk.img /dev/sdb --algorithms fbh:4k   # as a block device would see them\n  dedup analyze ~/src --delta --compression lz4,zstd --plot fold.svg\n  dedup analyze /big/archive --sample 64   # 1/64 of the index, ratios ± a 99 % bound"
)]
pub struct Args {
    /// Files, directories (walked; symlinks are not followed) and block
    /// devices; with --tar, tar streams ("-" for stdin).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The paths are tar streams: each regular file in them is analysed as
    /// a file.
    #[arg(long)]
    pub tar: bool,
    /// Algorithms to compare in one read of the data (default: wfh, and
    /// fbh, rabin and fastcdc at 4K, 8K, 16K, 32K, 64K).
    #[arg(long, value_delimiter = ',')]
    pub algorithms: Option<Vec<String>>,
    /// Also compress each distinct chunk (lz4, zstd): deduplication and
    /// compression together.
    #[arg(long, value_delimiter = ',')]
    pub compression: Vec<String>,
    /// Also find, for each non-duplicate chunk, a similar stored chunk
    /// (super-features) and measure its delta-encoded size.
    #[arg(long)]
    pub delta: bool,
    /// Memory for the chunks delta encoding diffs against, over all
    /// algorithms (oldest dropped first; the report counts what that lost).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub delta_memory: String,
    /// Index only 1 in RATE distinct chunks (chosen by fingerprint), for
    /// datasets whose index would not fit in memory: ratios become
    /// estimates with a stated 99 % bound.
    #[arg(long, value_name = "RATE", default_value_t = 1)]
    pub sample: u64,
    /// Draw fold factor and CPU cost against chunk size to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Fingerprint: blake3, sha256 or md5.
    #[arg(long, default_value = "blake3")]
    pub hash: String,
    /// Reader threads (default: the number of CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// One CSV row per algorithm.
    #[arg(long)]
    pub csv: bool,
}

/// The compressor a stream starts with (by magic number), if any.
fn compressed_with(input: &mut impl std::io::BufRead) -> Option<&'static str> {
    let head = input.fill_buf().ok()?;
    [
        (&[0x1f, 0x8b][..], "gzip"),
        (b"BZh", "bzip2"),
        (&[0xfd, b'7', b'z', b'X', b'Z'][..], "xz"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
    ]
    .into_iter()
    .find(|(magic, _)| head.starts_with(magic))
    .map(|(_, tool)| tool)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let algorithms: Vec<Algorithm> = match &a.algorithms {
        Some(list) => list
            .iter()
            .map(|s| Algorithm::parse(s.trim()).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?,
        None => dedup_analyze::algo::defaults(),
    };
    if algorithms.is_empty() {
        bail!("--algorithms is empty");
    }
    let hash: HashAlgo = a.hash.parse().map_err(|e| anyhow::anyhow!("--hash: {e}"))?;
    let mut analysis = Analysis::new(algorithms, hash);
    analysis.codecs = a
        .compression
        .iter()
        .map(|c| Codec::parse(c.trim()).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    analysis.sample = dedup_analyze::sample::Sampling::new(a.sample)
        .map_err(|e| anyhow::anyhow!("--sample: {e}"))?;
    if a.delta {
        if a.sample > 1 {
            bail!("--delta needs every chunk's bytes and cannot be combined with --sample; drop one of them");
        }
        let memory = dedup_core::size::parse_size(&a.delta_memory)
            .map_err(|e| anyhow::anyhow!("--delta-memory `{}`: {e}", a.delta_memory))?;
        analysis.measure_delta(memory);
    }
    if analysis.algorithms.iter().all(|x| *x == Algorithm::Wfh)
        && (a.delta || !analysis.codecs.is_empty())
    {
        eprintln!("note: --delta and --compression apply to chunks, not to whole files (wfh): add fbh, rabin or fastcdc algorithms to see them");
    }
    if a.plot.is_some()
        && analysis
            .algorithms
            .iter()
            .all(|x| x.nominal_size().is_none())
    {
        bail!("--plot draws against chunk size: add at least one fbh, rabin or fastcdc algorithm");
    }
    let analysis = Arc::new(analysis);
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let files = if a.tar {
        Vec::new()
    } else {
        let (walked, skipped) = dedup_analyze::walk_parallel(&a.paths, threads);
        for (p, why) in skipped {
            analysis.skip(&p, why);
        }
        analysis.note_symlinks(walked.symlinks);
        walked.files
    };
    let sizes = |paths: &[PathBuf]| -> u64 {
        paths
            .iter()
            .filter_map(|f| match std::fs::metadata(f) {
                Ok(m) if m.is_file() => Some(m.len()),
                // Block devices say 0: ask the device.
                _ => dedup_analyze::input_len(&mut std::fs::File::open(f).ok()?).ok(),
            })
            .sum()
    };
    let total = if a.tar {
        sizes(&a.paths)
    } else {
        sizes(&files)
    };
    // Ctrl-C: stop reading and report what was read; a second one (or
    // SIGTERM after it) ends at once.
    let stopper = analysis.clone();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])
        .context("installing signal handlers")?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        for (n, _) in signals.forever().enumerate() {
            if n == 0 {
                stopper.stop.store(true, Ordering::Relaxed);
                eprintln!("\nstopping: the report covers what was read (again to quit at once)");
            } else {
                std::process::exit(130);
            }
        }
    });
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template(
            "{bytes}/{total_bytes} [{bar:30}] {msg} {bytes_per_sec}, {eta} left",
        )?
        .progress_chars("=> "),
    );
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            if !a.tar {
                return analysis.run(&files, threads);
            }
            for p in &a.paths {
                let input: Box<dyn std::io::Read> = if p.as_os_str() == "-" {
                    Box::new(std::io::stdin().lock())
                } else {
                    match std::fs::File::open(p) {
                        Ok(f) => Box::new(f),
                        Err(e) => {
                            analysis.skip(p, e.to_string());
                            continue;
                        }
                    }
                };
                let mut input = std::io::BufReader::with_capacity(1 << 20, input);
                if let Some(tool) = compressed_with(&mut input) {
                    analysis.skip(
                        p,
                        format!("a {tool}-compressed stream, not a tar stream: decompress it first, e.g. `{tool} -dc FILE | dedup analyze --tar -`"),
                    );
                    continue;
                }
                analysis.run_tar(p, input);
            }
        });
        while !worker.is_finished() {
            bar.set_position(analysis.bytes_read.load(Ordering::Relaxed));
            bar.set_message(if a.tar {
                format!("{} files", analysis.files_read.load(Ordering::Relaxed))
            } else {
                format!(
                    "{}/{} files",
                    analysis.files_read.load(Ordering::Relaxed),
                    files.len()
                )
            });
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    bar.finish_and_clear();
    handle.close();
    let r = report(&analysis);
    if a.json {
        print_json(&r)?;
    } else if a.csv {
        out!("{}", dedup_analyze::report::csv(&r));
    } else {
        out!("{}", dedup_analyze::report::table(&r));
    }
    // The report is out first: a plot that cannot be drawn loses nothing.
    if let Some(p) = &a.plot {
        super::analyze_plot::draw(p, &r)?;
        eprintln!("plot written to {}", p.display());
    }
    if r.bytes == 0 && r.files == 0 {
        eprintln!(
            "error: no data read: the inputs hold no readable regular files (see the skipped list)"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
