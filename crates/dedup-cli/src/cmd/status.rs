//! `dedup status`: the device's statistics, live from the serving process
//! or read from a stopped device.

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::control::Request;
use dedup_core::stats::Stats;
use dedup_core::OpenOptions;
use serde::Serialize;

use super::{print_json, reach, Reached};
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Show a device's statistics (dedup ratio, space, I/O counters)",
    after_help = "Examples:\n  dedup status ./dev\n  dedup status ./dev --json | jq .dedup_ratio"
)]
pub struct Args {
    /// Device directory.
    pub dir: PathBuf,
    /// Print JSON (snake_case keys) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
pub struct StatusReport {
    pub device: String,
    /// True when read live from a running `dedup serve`.
    pub served: bool,
    #[serde(flatten)]
    pub stats: Stats,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (served, stats) = match reach(&a.dir, &Request::Status, &OpenOptions::default())? {
        Reached::Served(v) => (true, serde_json::from_value::<Stats>(v)?),
        Reached::Offline(dev) => (false, dev.stats()),
    };
    let report = StatusReport {
        device: a.dir.display().to_string(),
        served,
        stats,
    };
    if a.json {
        print_json(&report)?;
    } else {
        print!("{}", render::status(&report));
    }
    Ok(ExitCode::SUCCESS)
}
