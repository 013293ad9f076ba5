//! `dedup trace gen` (synthetic traces shaped like Dmdedup Table 1's) and
//! `dedup trace stats` (a trace's own Table 1 columns).

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use dedup_trace::gen::{GenParams, Generator, Preset};
use dedup_trace::native::Writer;
use dedup_trace::stats::StatsBuilder;

use super::shared::args::size_arg;
use super::shared::progress::bytes_bar;
use super::shared::report::print_json;
use super::shared::trace_stats::{measure, table};

#[derive(clap::Args)]
#[command(about = "Make synthetic traces, or show a trace's statistics")]
pub struct Args {
    #[command(subcommand)]
    pub command: TraceCommand,
}

#[derive(clap::Subcommand)]
pub enum TraceCommand {
    Gen(GenArgs),
    Stats(StatsArgs),
}

#[derive(clap::Args)]
#[command(
    about = "Write a synthetic trace (dedup's format) with a chosen dedup ratio, mix, sizes and locality",
    after_help = "Presets take Dmdedup Table 1's dedup ratio, read share and working-set share;\n\
        options given after them override.\n\nExamples:\n  dedup trace gen web.trace --preset web --size 2G\n  dedup trace gen t.trace --size 256M --dedup-ratio 4 --read-share 0.3 --request-sizes 4k,64k --working-set 128M"
)]
pub struct GenArgs {
    /// Where to write the trace.
    pub out: PathBuf,
    /// web, mail or homes (FIU traces of Dmdedup Table 1).
    #[arg(long, value_parser = ["web", "mail", "homes"])]
    pub preset: Option<String>,
    /// Bytes the trace writes in total.
    #[arg(long, value_parser = size_arg, default_value = "1G")]
    pub size: u64,
    /// Written blocks / distinct contents (1 = nothing deduplicates).
    #[arg(long)]
    pub dedup_ratio: Option<f64>,
    /// Share of requests that are reads, 0 to below 1.
    #[arg(long)]
    pub read_share: Option<f64>,
    /// Request sizes (multiples of 4 KiB), drawn uniformly.
    #[arg(long, value_delimiter = ',', value_parser = size_arg)]
    pub request_sizes: Option<Vec<u64>>,
    /// Probability that a request starts where the previous one ended.
    #[arg(long)]
    pub locality: Option<f64>,
    /// The span of offsets requests fall in.
    #[arg(long, value_parser = size_arg)]
    pub working_set: Option<u64>,
    /// A FLUSH after every N writes (0: none).
    #[arg(long)]
    pub flush_every: Option<u64>,
    /// Requests per second, for the timestamps (`replay --timing`).
    #[arg(long)]
    pub rate: Option<f64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the trace's statistics as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
#[command(about = "A trace's statistics: Dmdedup Table 1's columns and the span a replay needs")]
pub struct StatsArgs {
    pub trace: PathBuf,
    /// Refuse the trace at its first malformed line (default: skip and count).
    #[arg(long)]
    pub strict: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.command {
        TraceCommand::Gen(g) => gen(g),
        TraceCommand::Stats(s) => stats(s),
    }
}

fn gen(a: GenArgs) -> anyhow::Result<ExitCode> {
    let mut p = match a.preset.as_deref().and_then(Preset::parse) {
        Some(preset) => preset.params(a.size, a.seed),
        None => GenParams {
            seed: a.seed,
            write_bytes: a.size,
            dedup_ratio: 2.0,
            read_share: 0.0,
            request_sizes: vec![4096],
            locality: 0.0,
            working_set: a.size.div_ceil(4096) * 4096,
            flush_every: 0,
            rate: 10_000.0,
        },
    };
    p.dedup_ratio = a.dedup_ratio.unwrap_or(p.dedup_ratio);
    p.read_share = a.read_share.unwrap_or(p.read_share);
    p.request_sizes = a.request_sizes.unwrap_or(p.request_sizes);
    p.locality = a.locality.unwrap_or(p.locality);
    p.working_set = a.working_set.unwrap_or(p.working_set);
    p.flush_every = a.flush_every.unwrap_or(p.flush_every);
    p.rate = a.rate.unwrap_or(p.rate);
    let generator = Generator::new(p).map_err(anyhow::Error::msg)?;
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = Writer::new(BufWriter::new(file))?;
    let mut b = StatsBuilder::default();
    for r in generator {
        b.add(&r);
        w.write(&r)?;
    }
    w.into_inner()
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("writing {}", a.out.display()))?;
    let s = b.finish();
    if a.json {
        print_json(&s)?;
    } else {
        out!("{}", table(&s));
    }
    Ok(ExitCode::SUCCESS)
}

fn stats(a: StatsArgs) -> anyhow::Result<ExitCode> {
    let bar = bytes_bar("reading the trace")?;
    let (s, _, _) = measure(&a.trace, a.strict, Some(&bar))?;
    bar.finish_and_clear();
    if a.json {
        print_json(&s)?;
    } else {
        out!("{}", table(&s));
    }
    Ok(ExitCode::SUCCESS)
}
