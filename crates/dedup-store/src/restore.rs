//! Restoring a backup from its recipe alone: each segment is read with one
//! ranged read of exactly its stored bytes, checked (crc32c, then BLAKE3
//! against its catalog entry, which must carry the recipe's fingerprint)
//! and written out in order. No index is consulted.

use std::io::Write;

use crate::container::container_name;
use crate::error::Error;
use crate::recipe::Recipe;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};

impl Repository {
    /// Write backup `name`'s stream to `out`; the number of bytes written.
    /// A missing or damaged recipe or container is refused, naming it;
    /// `out` then holds the segments before the damaged one (all checked).
    pub fn restore(&self, name: &str, mut out: impl Write) -> RepoResult<u64> {
        let record = self.backup(name)?;
        let recipe = match self.store.get(&record.recipe) {
            Err(Error::NotFound { .. }) => {
                return Err(RepoError::corrupt(
                    &record.recipe,
                    format!("missing, but backup {name} needs it"),
                ))
            }
            other => Recipe::decode(&record.recipe, &other?)?,
        };
        if recipe.stream_len != record.report.bytes_in {
            return Err(RepoError::corrupt(
                &record.recipe,
                format!(
                    "{} bytes long, but backup {name} read {}",
                    recipe.stream_len, record.report.bytes_in
                ),
            ));
        }
        let mut written = 0u64;
        for s in &recipe.segments {
            let missing = |_| {
                RepoError::corrupt(
                    container_name(s.container),
                    format!("missing, but backup {name} needs it"),
                )
            };
            let catalog = match self.catalog(s.container) {
                Err(e @ Error::NotFound { .. }) => return Err(missing(e)),
                other => other?,
            };
            let entry = catalog.entries().get(s.entry as usize).copied();
            if entry.map(|e| (e.fingerprint, e.location.raw_len)) != Some((s.fingerprint, s.len)) {
                return Err(RepoError::corrupt(
                    container_name(s.container),
                    format!(
                        "entry {} is not the segment recipe {} expects",
                        s.entry, record.recipe
                    ),
                ));
            }
            let data = match catalog.read_segment(&*self.store, s.entry as usize) {
                Ok(data) => data,
                // A garbage collection may have compacted the container
                // since its catalog was read (same entries, new offsets):
                // read the catalog again, once.
                Err(_) => {
                    self.catalog_cache().forget(s.container);
                    let fresh = self.catalog(s.container)?;
                    fresh.read_segment(&*self.store, s.entry as usize)?
                }
            };
            out.write_all(&data).map_err(|cause| RepoError::Io {
                context: format!("writing the restore of backup {name}"),
                cause,
            })?;
            written += data.len() as u64;
        }
        out.flush().map_err(|cause| RepoError::Io {
            context: format!("writing the restore of backup {name}"),
            cause,
        })?;
        Ok(written)
    }
}
