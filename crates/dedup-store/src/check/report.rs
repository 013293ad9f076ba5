//! What a store check found: counts, damage (each naming the object and
//! the backups it costs) and garbage (what a collection may remove). Kept
//! apart from the checking so the CLI and tests see one plain, serialisable
//! value.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Whether every segment was read and verified (`--data`), not only
    /// the catalogs and repository objects.
    pub data_verified: bool,
    pub counts: CheckCounts,
    /// Damage: objects that are missing, unreadable or wrong. Empty means
    /// the repository checked clean.
    pub problems: Vec<Problem>,
    /// Objects no committed backup needs: left by crashed backups or
    /// deleted ones, for a garbage collection. Not damage.
    pub garbage: Vec<Garbage>,
    /// False when a damaged backup object or recipe hid what it references:
    /// then some "garbage" may be what a damaged backup needed, and a
    /// collection must not trust this list.
    pub garbage_complete: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckCounts {
    /// Container objects (well-formed names).
    pub containers: u64,
    /// Segments in the catalogs that could be read.
    pub segments: u64,
    /// Bytes of the containers that could be read (whole, with data
    /// verification; as their catalogs account for them, without).
    pub bytes_stored: u64,
    /// Backup objects.
    pub backups: u64,
    /// Recipe objects (a recipe in parts counts once).
    pub recipes: u64,
    /// Tree objects (files' metadata of backups of files).
    pub trees: u64,
}

/// One damaged object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The object's name, e.g. `containers/00000000000000a3`.
    pub object: String,
    /// What is wrong with it.
    pub detail: String,
    /// The backups that cannot be fully restored because of it.
    pub affected_backups: BTreeSet<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.detail)
    }
}

/// One object no committed backup needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Garbage {
    pub object: String,
    pub reason: String,
}

impl fmt::Display for Garbage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.reason)
    }
}

impl CheckReport {
    /// No damage found (garbage is not damage).
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every backup some problem affects, sorted.
    pub fn affected_backups(&self) -> BTreeSet<&str> {
        let each = self.problems.iter().flat_map(|p| &p.affected_backups);
        each.map(String::as_str).collect()
    }

    /// Record a problem; its index, to add affected backups to later.
    pub(crate) fn problem(&mut self, object: &str, detail: impl Into<String>) -> usize {
        self.problems.push(Problem {
            object: object.to_string(),
            detail: detail.into(),
            affected_backups: BTreeSet::new(),
        });
        self.problems.len() - 1
    }

    /// Record a problem that costs `backups`.
    pub(crate) fn problem_affecting<'a>(
        &mut self,
        object: &str,
        detail: impl Into<String>,
        backups: impl IntoIterator<Item = &'a String>,
    ) {
        let i = self.problem(object, detail);
        self.affect(i, backups);
    }

    pub(crate) fn affect<'a>(
        &mut self,
        problem: usize,
        backups: impl IntoIterator<Item = &'a String>,
    ) {
        let set = &mut self.problems[problem].affected_backups;
        set.extend(backups.into_iter().cloned());
    }

    pub(crate) fn garbage(&mut self, object: &str, reason: impl Into<String>) {
        self.garbage.push(Garbage {
            object: object.to_string(),
            reason: reason.into(),
        });
    }
}
