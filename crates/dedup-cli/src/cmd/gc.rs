//! `dedup gc`: free chunks that only the hash index still references,
//! online (through the serving process) or offline.

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::control::Request;
use dedup_core::engine::GcReport;
use dedup_core::OpenOptions;

use super::{print_json, reach, Reached};
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Run garbage collection: free chunks no LBN references any more",
    after_help = "Works while the device is served (online) or stopped (offline).\n\nExamples:\n  dedup gc ./dev\n  dedup gc ./dev --json"
)]
pub struct Args {
    /// Device directory.
    pub dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let report: GcReport = match reach(
        &a.dir,
        &Request::Gc,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )? {
        Reached::Served(v) => serde_json::from_value(v)?,
        Reached::Offline(dev) => {
            let r = dev.gc()?;
            dev.close()?;
            r
        }
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!("{}", render::gc(&report));
    }
    Ok(ExitCode::SUCCESS)
}
