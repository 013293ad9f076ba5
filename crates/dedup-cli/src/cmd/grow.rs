//! `dedup grow`: a larger logical size or more data space for a stopped
//! device (`dedup_core::grow`).

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::grow::{self, GrowOptions};
use dedup_core::size::format_size;

use super::shared::args::size_arg;
use super::shared::report::print_json;
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Grow a stopped device: a larger logical size (--size) or more data space (--physical-size)",
    after_help = "NBD clients learn a device's size when they connect and do not follow a change on a live connection, so grow works on a stopped device: unmount, stop `dedup serve`, grow, serve again, reconnect, then grow the filesystem (resize2fs /dev/nbd0).\n\nsparse, disktable and inram copy their metadata into a new file of the new size and rename it over the old (a crash before the rename leaves the device as it was); cowbtree and lsm grow in place. thin cannot grow. For more data space on a block device, grow the block device first (lvextend).\n\nExamples:\n  dedup grow ./dev --size 20G\n  dedup grow ./dev --physical-size 500G\n  dedup grow ./dev --size 2T --physical-size 1T --json"
)]
pub struct Args {
    /// Device directory (a stopped device).
    pub dir: PathBuf,
    /// New logical size clients see (K, M, G, T suffixes); at least the current one.
    #[arg(long, value_parser = size_arg, required_unless_present = "physical_size")]
    pub size: Option<u64>,
    /// New data capacity; at least the current one. A data file is made
    /// longer; a block device must have been grown already.
    #[arg(long, value_parser = size_arg)]
    pub physical_size: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "copying metadata [{bar:40}] {pos}/{len} entries ({per_sec}, {eta} left)",
        )?
        .progress_chars("=> "),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let opts = GrowOptions {
        size: a.size,
        physical_size: a.physical_size,
    };
    let report = grow::grow(&a.dir, &opts, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report?;
    if a.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "Grew {}: {} -> {} logical, {} -> {} of chunk space ({}, {:.1} s{}).",
        a.dir.display(),
        format_size(report.logical_size_before),
        format_size(report.logical_size),
        format_size(report.physical_size_before),
        format_size(report.physical_size),
        report.method,
        report.seconds,
        if report.method == "copied" {
            format!(
                "; {} mappings and {} chunks copied",
                report.lbns_copied, report.chunks_copied
            )
        } else {
            String::new()
        }
    );
    if let Some(s) = report.sizing {
        out!("{}", render::sizing(&s));
    }
    if report.logical_size > report.logical_size_before {
        outln!(
            "Serve it again (`dedup serve {}`), reconnect, then grow the filesystem on it (e.g. resize2fs).",
            a.dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
