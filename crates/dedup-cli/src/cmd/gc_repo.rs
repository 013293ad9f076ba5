//! `dedup gc REPO`: a backup repository's garbage collection (grouped
//! mark-and-sweep, `dedup_store::gc`), with a progress bar and a report.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::config::CONFIG_OBJECT;
use dedup_store::gc::DEFAULT_COMPACT_BELOW;
use dedup_store::index::IndexConfig;
use dedup_store::{GcOptions, RepoError, RepoLocation, Repository};

use super::shared::report::{damaged_note, print_json};

/// The repository `target` names, if it names one: any `s3://` URL, or a
/// directory with a `config` object (a device directory has no such
/// file; one that does not decode is still the repository's: opening it
/// names the damaged config). An unknown `scheme://` is an error.
pub fn repository_at(target: &Path) -> anyhow::Result<Option<RepoLocation>> {
    let location: RepoLocation = match target.to_str() {
        Some(text) => text.parse()?,
        None => RepoLocation::Dir(target.to_path_buf()),
    };
    Ok(match location.dir() {
        Some(dir) if !dir.join(CONFIG_OBJECT).is_file() => None,
        _ => Some(location),
    })
}

/// Collect the garbage of the repository at `location` (`dedup gc`'s
/// arguments, taken apart by `gc.rs`).
pub fn run(
    location: &RepoLocation,
    compact_below: Option<f64>,
    writer_wait: std::time::Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The sampled index from its checkpoint: no catalog is read at open,
    // and the checkpoint is refreshed (hooks into deleted containers gone)
    // when the collection closes the repository.
    let repo = match Repository::open_sampled(
        location,
        IndexConfig {
            cache_entries: 0,
            ..IndexConfig::default()
        },
    ) {
        // It has a config, so it is a repository whose config is damaged.
        Err(RepoError::NotARepository { repo, detail }) if location.dir().is_some() => bail!(
            "{repo}: this backup repository's config object ({CONFIG_OBJECT}) is damaged: {detail}. Nothing in the repository can be read or collected without it; `dedup store check {repo}` says what else is wrong"
        ),
        other => other?,
    };
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")?
            .progress_chars("=> "),
    );
    if json || !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let progress = |phase: &str, done: u64, total: u64| {
        bar.set_message(match phase {
            "mark" => "marking recipes",
            "sweep" => "deleting containers",
            _ => "compacting containers",
        });
        bar.set_length(total);
        bar.set_position(done);
    };
    let result = repo.gc(&GcOptions {
        progress: Some(&progress),
        compact_below: compact_below.map_or(DEFAULT_COMPACT_BELOW, |p| p / 100.0),
        writer_wait,
    });
    bar.finish_and_clear();
    let r = result?;
    if json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "Collected {}: {} containers deleted and {} compacted ({} reclaimed), {} orphan recipes, recipe parts and trees removed; {} groups marked again ({} recipes read), {} reused, {} dropped; {} backups, {} containers; {:.2} s.",
        location,
        r.containers_swept,
        r.containers_compacted,
        format_size(r.bytes_reclaimed),
        r.orphans_removed,
        r.groups_remarked,
        r.recipes_read,
        r.groups_reused,
        r.groups_dropped,
        r.backups,
        r.containers,
        r.seconds
    );
    if let Some(note) = damaged_note(&r) {
        outln!("{note}");
    }
    if r.containers_protected > 0 {
        outln!(
            "{} unreferenced containers were kept because a running backup uses them; the next collection takes them if they are still unreferenced.",
            r.containers_protected
        );
    }
    if r.seconds_waiting_for_writers >= 0.1 {
        outln!(
            "Waited {:.1} s for backups in other processes to catch up with the collections.",
            r.seconds_waiting_for_writers
        );
    }
    if r.writers_not_caught_up > 0 {
        outln!(
            "{} writers did not look at the newest collection within --writer-wait: a backup of theirs that reuses what it condemned stops (\"run it again\"); none loses data.",
            r.writers_not_caught_up
        );
    }
    Ok(ExitCode::SUCCESS)
}
