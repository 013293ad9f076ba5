//! `dedup backup REPO NAME --device DIR`: back up a deduplicated device
//! by the fingerprints its metadata keeps (issue 39): only chunks the
//! repository lacks are read from the data file, each checked against its
//! fingerprint. A stopped device is opened here; a served one is backed
//! up through a snapshot its server keeps while clients go on writing.
//! The backup restores as the device's image.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use dedup_store::backup_blocks::BlocksReport;
use dedup_store::{BackupReport, RepoLocation};
use serde::Serialize;

use super::shared::args::IndexArgs;
use super::shared::progress::blocks_bar;
use super::shared::repo::open_indexed;
use super::shared::report::{mb_per_sec, print_json, ratio_text, IndexJson, ReportJson};
use super::shared::served_blocks::served_or_stopped;

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    device: String,
    /// Backed up through a snapshot its server kept (it was served).
    served: bool,
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
    // The repository (its index checkpoint) and the device (its
    // metadata) open side by side: on an incremental backup the two
    // opens are a third of the time. A served device's snapshot is
    // frozen while the repository opens, no earlier: it holds what
    // clients overwrite until the backup ends.
    let (repo, device) = std::thread::scope(|s| {
        let repo = s.spawn(|| open_indexed(repo_at, index));
        let device = served_or_stopped(dir, walk_all);
        let repo = repo
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (repo, device)
    });
    let repo = repo?;
    let (source, served) = device?;
    let bar = blocks_bar(name, source.blocks(), json)?;
    let start = Instant::now();
    let result = repo.backup_blocks(name, group, source.as_ref(), &mut |done| {
        bar.set_position(done)
    });
    drop(source);
    bar.finish_and_clear();
    let (r, blocks): (BackupReport, BlocksReport) = result?;
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        name: name.into(),
        group: group.into(),
        device: dir.display().to_string(),
        served,
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
    let how = report.blocks.how();
    let at = if served {
        " (served: a snapshot of one instant)"
    } else {
        ""
    };
    outln!(
        "Backed up device {}{at} into {} as {} (group {}), {how}: {} in, {} new ({} written), dedup ratio {}; {:.1} s.",
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
