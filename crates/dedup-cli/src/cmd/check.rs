//! `dedup check`: verify metadata consistency (and, with --data, that every
//! stored chunk still hashes to its fingerprint). Exit 0 clean, 1 problems
//! found, 2 could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::control::Request;
use dedup_core::engine::CheckReport;

use super::{print_json, reach, Reached};
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Check a device's metadata: refcounts, mappings, allocation (exit 0 clean, 1 problems, 2 could not run)",
    after_help = "Online checks pause I/O while they run.\n\nExamples:\n  dedup check ./dev\n  dedup check ./dev --data --json"
)]
pub struct Args {
    /// Device directory.
    pub dir: PathBuf,
    /// Also read every stored chunk and compare it with its fingerprint.
    #[arg(long)]
    pub data: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let report: CheckReport = match reach(&a.dir, &Request::Check { data: a.data }, false)? {
        Reached::Served(v) => serde_json::from_value(v)?,
        Reached::Offline(dev) => {
            let bar = indicatif::ProgressBar::new(0).with_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:40}] {pos}/{len} chunks ({per_sec}, {eta} left)",
                )?
                .progress_chars("=> "),
            );
            bar.set_message(if a.data { "re-hashing" } else { "checking" });
            let report = dev.check_with_progress(a.data, &|done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            bar.finish_and_clear();
            report
        }
    };
    if a.json {
        print_json(&report)?;
    } else {
        print!("{}", render::check(&report));
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
