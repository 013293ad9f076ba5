//! Backing up one stream in this process: cut it into segments and append
//! them to a [`BackupSession`](crate::session::BackupSession), which keeps
//! each segment the index finds already stored, writes the new ones into
//! containers, then commits the recipe and the backup object, in that
//! order. Only the last `put` makes the backup visible, so a backup that
//! fails or dies part-way leaves no backup, only unreferenced containers
//! for GC.
//!
//! Two stages, as the paper's client pipeline (§3.4) on one machine: a
//! thread reads, cuts and hashes (BLAKE3 is the dearest step), and this
//! one looks up, compresses and writes, so the two overlap on two cores.

use std::io::{self, BufReader, Read};
use std::sync::mpsc;

use dedup_core::fingerprint::Fingerprint;

use crate::backup::BackupReport;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::{Segmenter, Segmenting};
use crate::session::BackupSession;
use crate::writer::HASH;

/// Segments handed from the hashing thread at a time, and batches in
/// flight: enough to ride out a container write, little enough to bound
/// RAM (about 8 × 64 × 4 KiB at the default segment size).
const BATCH: usize = 64;
const IN_FLIGHT: usize = 8;

type Batch = io::Result<Vec<(Vec<u8>, Fingerprint)>>;

impl Repository {
    /// Back up `reader` as backup `name` in `group`.
    pub fn backup_stream(
        &self,
        name: &str,
        group: &str,
        reader: impl Read + Send,
    ) -> RepoResult<BackupReport> {
        let mut session = self.begin_backup(name, group)?;
        append_stream(&mut session, self.config.segmenting, reader).map_err(|e| match e {
            StreamError::Read(cause) => RepoError::Io {
                context: format!("reading the stream of backup {name}"),
                cause,
            },
            StreamError::Repo(e) => e,
        })?;
        Ok(session.commit()?.report)
    }
}

pub(crate) enum StreamError {
    Read(io::Error),
    Repo(RepoError),
}

/// Cut `reader` into segments with `how` and append them all to `session`,
/// hashing on a second thread.
pub(crate) fn append_stream(
    session: &mut BackupSession<'_>,
    how: Segmenting,
    reader: impl Read + Send,
) -> Result<(), StreamError> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<Batch>(IN_FLIGHT);
        scope.spawn(move || {
            let mut batch = Vec::with_capacity(BATCH);
            for segment in Segmenter::new(how, BufReader::with_capacity(1 << 20, reader)) {
                match segment {
                    Ok(s) => {
                        let fp = HASH.fingerprint(&s);
                        batch.push((s, fp));
                        if batch.len() == BATCH
                            && tx
                                .send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))))
                                .is_err()
                        {
                            return; // the appender stopped
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
            if !batch.is_empty() {
                let _ = tx.send(Ok(batch));
            }
        });
        // Dropping `rx` on an error stops the reader at its next send.
        for batch in rx {
            for (data, fp) in batch.map_err(StreamError::Read)? {
                session
                    .append_hashed(&data, fp)
                    .map_err(StreamError::Repo)?;
            }
        }
        Ok(())
    })
}
