//! Report types and text more than one command prints: a backup's
//! figures (`ReportJson`) and its index's cost (`IndexJson`), the lines of
//! a backup of files' report, damage named after a restore, a collection's
//! note on damaged backups, rates, times and segment sizes in words, and
//! JSON output itself.

use std::process::ExitCode;

use dedup_core::size::format_size;
use dedup_store::index::projection::hook_bytes_at;
use dedup_store::{BackupReport, DamagedRange, GcReport, Repository, Segmenting, WalkCounts};
use serde::Serialize;

/// Print `v` as pretty JSON: every command's `--json`. A command that
/// reached a repository in a bucket also reports the requests it sent
/// (`requests`: put, get, head, list, delete), what the bill counts.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let sent = dedup_store::s3::requests_sent();
    if sent != Default::default() {
        let mut value = serde_json::to_value(v)?;
        if let Some(fields) = value.as_object_mut() {
            fields.insert("requests".into(), serde_json::to_value(sent)?);
            outln!("{}", serde_json::to_string_pretty(&value)?);
            return Ok(());
        }
    }
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A backup's report as `backup --json` and `list --json` give it: the
/// store's figures, and the ratio as JSON can hold it.
#[derive(Serialize)]
pub struct ReportJson {
    #[serde(flatten)]
    pub counts: BackupReport,
    /// Bytes in per new byte; null when nothing new was stored.
    pub dedup_ratio: Option<f64>,
}

impl From<BackupReport> for ReportJson {
    fn from(counts: BackupReport) -> ReportJson {
        let ratio = counts.dedup_ratio();
        ReportJson {
            counts,
            dedup_ratio: ratio.is_finite().then_some(ratio),
        }
    }
}

/// What the index cost, for reports: RAM, and RAM per TiB of segments
/// stored (the paper's figure of merit for an index).
#[derive(Serialize, Clone, Copy, Debug)]
pub struct IndexJson {
    /// RAM of the tables that grow with the store (hooks, or the exact map).
    pub index_ram_bytes: u64,
    /// RAM of the fixed-size prefetch cache.
    pub index_cache_bytes: u64,
    pub index_fingerprints: u64,
    /// RAM now over the bytes stored now, per TiB; null before anything
    /// is stored. Not what 1 TiB will cost a sampled index: see
    /// `index_ram_at_1_tib`.
    pub index_ram_per_tib: Option<f64>,
    /// What a sampled index will hold at 1 TiB stored, by its sampling
    /// rule within its budget (null for an exact index, which grows with
    /// the store).
    pub index_ram_at_1_tib: Option<u64>,
}

impl IndexJson {
    pub fn of(repo: &Repository) -> Option<IndexJson> {
        let ram = repo.index_ram()?;
        let config = repo.config();
        let segment = u64::from(segment_bytes(config.segmenting));
        let stored = ram.fingerprints as f64 * segment as f64;
        Some(IndexJson {
            index_ram_bytes: ram.bytes,
            index_cache_bytes: ram.cache_bytes,
            index_fingerprints: ram.fingerprints,
            index_ram_per_tib: (stored > 0.0)
                .then(|| ram.bytes as f64 * (1u64 << 40) as f64 / stored),
            index_ram_at_1_tib: ram
                .budget
                .map(|budget| hook_bytes_at(1 << 40, budget, segment, config.container_target)),
        })
    }

    /// The report's line about the index: what it holds now, and for a
    /// sampled index what it will hold at 1 TiB (not now's RAM scaled up:
    /// below a few GiB every fingerprint is a hook, which sampling will
    /// not keep).
    pub fn text(&self) -> String {
        let later = match (self.index_ram_at_1_tib, self.index_ram_per_tib) {
            (Some(b), _) => format!(
                " (sampled within its budget: {} at 1 TiB stored)",
                format_size(b)
            ),
            (None, Some(b)) => format!(" ({} per TiB stored)", format_size(b as u64)),
            (None, None) => String::new(),
        };
        format!(
            "Index: {} of RAM for {} segments{}, and a {} prefetch cache.",
            format_size(self.index_ram_bytes),
            self.index_fingerprints,
            later,
            format_size(self.index_cache_bytes)
        )
    }

    pub fn print(&self) {
        outln!("{}", self.text());
    }
}

/// A backup's dedup ratio in words.
pub fn ratio_text(r: &BackupReport) -> String {
    let ratio = r.dedup_ratio();
    if ratio.is_finite() {
        format!("{ratio:.2}")
    } else {
        "infinite (nothing new)".into()
    }
}

/// A segment's expected size.
pub fn segment_bytes(s: Segmenting) -> u32 {
    match s {
        Segmenting::Fixed { size } => size,
        Segmenting::FastCdc { avg, .. } => avg,
    }
}

/// How a repository cuts segments, in words.
pub fn segments_label(s: Segmenting) -> String {
    match s {
        Segmenting::Fixed { size } => format!("fixed {}", format_size(size.into())),
        Segmenting::FastCdc { min, avg, max } => format!(
            "FastCDC {}-{} avg {}",
            format_size(min.into()),
            format_size(max.into()),
            format_size(avg.into())
        ),
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Decimal megabytes per second (0 for an instant).
pub fn mb_per_sec(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e6 / seconds
    } else {
        0.0
    }
}

/// What a backup of files held, for its one-line report: what the walk
/// found, as the report's first line. The sizes follow on a line of their
/// own, so a terminal never wraps the report mid-phrase.
pub fn counts_text(c: &WalkCounts) -> String {
    format!(
        "{} files, {} directories, {} symlinks, {} hard links, {} special files.\n",
        c.files, c.dirs, c.symlinks, c.hard_links, c.specials
    )
}

/// The line about what a backup of files reused from its parent.
pub fn reused_text(parent: &str, files: u64, bytes: u64) -> String {
    format!(
        "{files} unchanged files reused from backup {parent}: {} not read.",
        format_size(bytes)
    )
}

/// The end of the one-line report when `n` entries were skipped.
pub fn skipped_text(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!("; {n} skipped (see the warnings above)"),
    }
}

/// Name each damaged range of backup `name`'s restored stream on stderr
/// (`check` says what to run to learn more); the exit status: 1 if there
/// is any. The same for a restore beside the repository and one through
/// a server.
pub fn name_damage(name: &str, damaged: &[DamagedRange], check: &str) -> ExitCode {
    for d in damaged {
        eprintln!(
            "dedup: damaged: bytes {}..{} ({}) of backup {} not restored (written as zeros): {}",
            d.offset,
            d.offset + d.len,
            format_size(d.len),
            name,
            d.error
        );
    }
    if damaged.is_empty() {
        return ExitCode::SUCCESS;
    }
    let lost: u64 = damaged.iter().map(|d| d.len).sum();
    eprintln!(
        "dedup: {} of backup {} could not be restored (the ranges named above, zeros in their place); the rest was. {} says what is damaged.",
        format_size(lost),
        name,
        check
    );
    ExitCode::from(1)
}

/// What a damaged backup object made a collection keep, in words.
pub fn damaged_note(r: &GcReport) -> Option<String> {
    if r.backups_damaged == 0 {
        return None;
    }
    let mut note = format!(
        "{} backup objects are damaged (`dedup list` names them): what they may reference was kept, {} recipes, recipe parts and trees no readable backup names among it",
        r.backups_damaged, r.orphans_kept
    );
    if r.sweep_withheld {
        note.push_str("; one of those recipes cannot be read either, so no container was deleted or compacted");
    }
    note.push_str(
        ". Delete the damaged backups (dedup delete) for the next collection to reclaim it.",
    );
    Some(note)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_767_225_599), "2025-12-31 23:59:59 UTC");
    }
}
