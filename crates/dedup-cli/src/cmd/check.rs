//! `dedup check`: verify metadata consistency (and, with --data, that every
//! stored chunk still hashes to its fingerprint); with --repair, rebuild
//! reference counts and free space from the mappings. Exit 0 clean, 1
//! problems found (repaired or not), 2 could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use dedup_core::control::{self, Request};
use dedup_core::engine::{CheckReport, RepairReport};
use dedup_core::layout::{self, DevicePaths};
use dedup_core::{Device, OpenOptions};
use serde::Serialize;

use super::shared::device::{control_path, reach, Reached};
use super::shared::report::print_json;
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Check a device's metadata: refcounts, mappings, allocation (exit 0 clean, 1 problems, 2 could not run)",
    after_help = "Online checks pause I/O while they run; --repair needs a stopped device.\n\nExamples:\n  dedup check ./dev\n  dedup check ./dev --data --json\n  dedup check ./dev --repair"
)]
pub struct Args {
    /// Device directory.
    pub dir: PathBuf,
    /// Also read every stored chunk and compare it with its fingerprint.
    #[arg(long)]
    pub data: bool,
    /// Fix what the check finds: rebuild reference counts and free space from
    /// the LBN map and hash index, drop index entries that are out of range,
    /// duplicated or (with --data) no longer match their chunk. A table block
    /// that fails its checksum is rebuilt (counts, summaries, fingerprints
    /// by hashing the chunks), except one of the LBN map: the LBNs it held
    /// are unmapped and named. With --data
    /// it also keeps metadata older than the data device (put back from a
    /// backup, or a damaged newest superblock), unmapping every block whose
    /// chunk changed since.
    #[arg(long)]
    pub repair: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Repaired {
    before: CheckReport,
    changed: RepairReport,
    after: CheckReport,
}

fn progress_bar(data: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} chunks ({per_sec}, {eta} left)",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(if data { "re-hashing" } else { "checking" });
    Ok(bar)
}

fn check_offline(dev: &Device, data: bool) -> anyhow::Result<CheckReport> {
    let bar = progress_bar(data)?;
    let report = dev.check_with_progress(data, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    Ok(report)
}

fn repair(a: &Args) -> anyhow::Result<ExitCode> {
    if control::request(&control_path(&a.dir), &Request::Status)?.is_some() {
        bail!(
            "{} is being served; stop `dedup serve` first (--repair works on a stopped device)",
            a.dir.display()
        );
    }
    let paths = DevicePaths::from_dir(&a.dir)?;
    let dev = layout::open(
        &paths,
        &OpenOptions {
            writable: true,
            for_check: true,
            // Metadata older than the data is kept only when every chunk
            // is verified against its fingerprint (the data check).
            accept_stale: a.data,
            ..Default::default()
        },
    )?;
    let (before, changed) = dev.repair(a.data)?;
    let after = check_offline(&dev, a.data)?;
    dev.close()?;
    let clean_before = before.is_clean();
    let r = Repaired {
        before,
        changed,
        after,
    };
    if a.json {
        print_json(&r)?;
    } else {
        out!("{}", render::check(&r.before));
        outln!(
            "repaired: {} LBNs unmapped, {} hash index entries removed, {} reference counts set, {} fingerprints rebuilt",
            r.changed.lbns_unmapped,
            r.changed.index_entries_removed,
            r.changed.refcounts_set,
            r.changed.fingerprints_rebuilt
        );
        out!("{}", render::lost(&r.changed.lost));
        out!("after repair: {}", render::check(&r.after));
    }
    Ok(ExitCode::from(if clean_before { 0 } else { 1 }))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.repair {
        return repair(&a);
    }
    let opts = OpenOptions {
        for_check: true,
        ..Default::default()
    };
    let report: CheckReport = match reach(&a.dir, &Request::Check { data: a.data }, &opts)? {
        Reached::Served(v) => serde_json::from_value(v)?,
        Reached::Offline(dev) => check_offline(&dev, a.data)?,
    };
    if a.json {
        print_json(&report)?;
    } else {
        out!("{}", render::check(&report));
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
