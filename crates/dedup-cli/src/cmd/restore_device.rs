//! `dedup restore REPO NAME --device DIR`: restore a stream backup (a
//! device's image, from `backup --device` or `--stdin`) onto a stopped
//! dedup device by fingerprint (issue 39): a block the device already
//! holds is left alone, one whose chunk it stores elsewhere is mapped to
//! it (a reference, no data written), and only the rest is read from the
//! repository and written.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use dedup_core::Device;
use dedup_store::{BlocksRestored, RepoLocation, RestorePass};
use serde::Serialize;

use super::shared::device_blocks::DeviceBlocks;
use super::shared::progress::restore_bar;
use super::shared::repo::open_read_only;
use super::shared::report::{mb_per_sec, name_damage, print_json};

#[derive(Serialize)]
struct Report<'a> {
    name: &'a str,
    device: String,
    #[serde(flatten)]
    restored: &'a BlocksRestored,
    seconds: f64,
    mb_per_sec: f64,
}

pub fn run(
    repo_at: &RepoLocation,
    name: &str,
    dir: &Path,
    force: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let repo = open_read_only(repo_at)?;
    let record = repo.backup(name)?;
    if record.tree.is_some() {
        anyhow::bail!(
            "backup {name} holds files and directories: restore it into a directory, not onto a device"
        );
    }
    let target = DeviceBlocks::open_to_write(dir)?;
    let bytes = record.report.bytes_in;
    // A device refused is closed cleanly all the same.
    if let Err(e) = may_restore(&target.device, name, bytes, dir, force) {
        target.device.close()?;
        return Err(e);
    }
    let bar = restore_bar(name, bytes, json)?;
    let start = Instant::now();
    let result = repo.restore_blocks(name, &target, &mut |pass, done| {
        if pass == RestorePass::Write && bar.message() != "writing" {
            bar.set_message("writing");
            bar.set_position(0);
        }
        bar.set_position(done);
    });
    bar.finish_and_clear();
    // Closed cleanly whatever happened: what was restored stays, and a
    // restore that failed part-way is run again.
    let closed = target.device.close();
    let r = match (result, closed) {
        (Ok(r), Ok(())) => r,
        (Err(e), Ok(())) => return Err(e.into()),
        (Ok(_), Err(e)) => return Err(e.into()),
        (Err(e), Err(c)) => anyhow::bail!("{e}; then closing the device failed too: {c}"),
    };
    let seconds = start.elapsed().as_secs_f64();
    let code = name_damage(name, &r.damaged, &format!("`dedup store check {repo_at}`"));
    if json {
        print_json(&Report {
            name,
            device: dir.display().to_string(),
            restored: &r,
            seconds,
            mb_per_sec: mb_per_sec(r.bytes, seconds),
        })?;
        return Ok(code);
    }
    let how = match &r.written_because {
        None => format!(
            "by fingerprint: {} blocks, {} already there, {} mapped to chunks the device stores, {} trimmed",
            r.blocks, r.blocks_unchanged, r.blocks_mapped, r.blocks_zeroed
        ),
        Some(why) => format!("written whole, because {why}"),
    };
    outln!(
        "Restored {} of backup {name} onto device {}, {how}; {} read from the repository and written ({:.1} s).",
        dedup_core::size::format_size(r.bytes),
        dir.display(),
        dedup_core::size::format_size(r.bytes_written),
        seconds,
    );
    Ok(code)
}

/// Refuse a restore of `bytes` onto `device` (in `dir`) that it cannot
/// hold, or that would replace its data without `force`.
fn may_restore(
    device: &Device,
    name: &str,
    bytes: u64,
    dir: &Path,
    force: bool,
) -> anyhow::Result<()> {
    let size = device.size();
    if bytes > size {
        let cs = u64::from(device.config().chunk_size);
        bail!(
            "backup {name} is an image of {bytes} bytes and device {} holds only {size}: grow it first (`dedup grow {} --size {}`)",
            dir.display(),
            dir.display(),
            bytes.div_ceil(cs) * cs
        );
    }
    // Nothing destroyed without --force: a device holding data keeps it
    // unless the user says to replace it.
    let mapped = device.stats().chunks_mapped;
    if mapped > 0 && !force {
        bail!(
            "device {} holds data ({mapped} chunks mapped): restoring backup {name} onto it replaces its first {bytes} bytes; add --force to do so",
            dir.display()
        );
    }
    Ok(())
}
