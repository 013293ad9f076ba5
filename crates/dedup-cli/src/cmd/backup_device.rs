//! `dedup backup REPO NAME --device DIR`: back up a stopped deduplicated
//! device by the fingerprints its metadata keeps (issue 39): only chunks
//! the repository lacks are read from the data file, each checked against
//! its fingerprint. The backup restores as the device's image.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use dedup_store::backup_blocks::{BlockMap, BlocksReport};
use dedup_store::{BackupReport, RepoLocation};
use serde::Serialize;

use super::shared::args::IndexArgs;
use super::shared::device_blocks::DeviceBlocks;
use super::shared::progress::blocks_bar;
use super::shared::repo::open_indexed;
use super::shared::report::{mb_per_sec, print_json, ratio_text, IndexJson, ReportJson};

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    device: String,
    #[serde(flatten)]
    report: ReportJson,
    #[serde(flatten)]
    blocks: BlocksReport,
    #[serde(flatten)]
    index: Option<IndexJson>,
    seconds: f64,
    mb_per_sec: f64,
}

pub fn run(
    repo_at: &RepoLocation,
    index: &IndexArgs,
    name: &str,
    group: &str,
    dir: &Path,
    walk_all: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut source = DeviceBlocks::open_to_read(dir)?;
    if walk_all {
        source.ignore_changes();
    }
    let repo = open_indexed(repo_at, index)?;
    let bar = blocks_bar(name, source.blocks(), json)?;
    let start = Instant::now();
    let result = repo.backup_blocks(name, group, &source, &mut |done| bar.set_position(done));
    bar.finish_and_clear();
    let (r, blocks): (BackupReport, BlocksReport) = result?;
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        name: name.into(),
        group: group.into(),
        device: dir.display().to_string(),
        report: r.into(),
        blocks,
        index: IndexJson::of(&repo),
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let b = &report.blocks;
    let how = match &b.read_because {
        None => {
            let skipped = match (b.blocks_unwalked, &b.parent) {
                (0, _) | (_, None) => String::new(),
                (n, Some(p)) => format!(", {n} more unchanged since {p} by the device's tracking"),
            };
            format!(
                "by fingerprint: {} blocks walked ({} zero){skipped}, {} read from the device",
                b.blocks - b.blocks_unwalked,
                b.zero_blocks,
                b.blocks_read
            )
        }
        Some(why) => format!("read and hashed whole, because {why}"),
    };
    outln!(
        "Backed up device {} into {} as {} (group {}), {how}: {} in, {} new ({} written), dedup ratio {}; {:.1} s.",
        dir.display(),
        repo_at,
        name,
        group,
        dedup_core::size::format_size(r.bytes_in),
        dedup_core::size::format_size(r.bytes_new),
        dedup_core::size::format_size(r.bytes_written),
        ratio_text(&r),
        seconds,
    );
    Ok(ExitCode::SUCCESS)
}
