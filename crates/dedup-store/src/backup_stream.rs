//! Backing up one stream in this process: cut it into segments and append
//! them to a [`BackupSession`](crate::session::BackupSession), which keeps
//! each segment the index finds already stored, writes the new ones into
//! containers, then commits the recipe and the backup object, in that
//! order. Only the last `put` makes the backup visible, so a backup that
//! fails or dies part-way leaves no backup, only unreferenced containers
//! for GC.
//!
//! Stages, as the paper's client pipeline (§3.4) on one machine: a thread
//! reads and cuts, the thread pool hashes (BLAKE3) and compresses frames,
//! this thread looks up and fills containers, and a thread per sealed
//! container writes it, so all of them overlap on the machine's cores.

use std::io::{self, BufReader, Read};
use std::sync::mpsc;

use dedup_core::fingerprint::Fingerprint;

use crate::backup::BackupReport;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::{Segmenter, Segmenting};
use crate::session::BackupSession;
use crate::writer::HASH;

/// Segments hashed as one job, and jobs in flight: enough to keep every
/// core busy and ride out a container write, little enough to bound RAM
/// (about 8 × 64 × 4 KiB at the default segment size).
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

/// Cut `reader` into segments with `how` and append them all to `session`.
/// A thread reads and cuts; each batch of segments is hashed on the thread
/// pool (cutting and hashing cost about the same, so one thread doing both
/// was the bottleneck of a backup of duplicate data); this thread takes the
/// batches in stream order, each once hashed.
pub(crate) fn append_stream(
    session: &mut BackupSession<'_>,
    how: Segmenting,
    reader: impl Read + Send,
) -> Result<(), StreamError> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<mpsc::Receiver<Batch>>(IN_FLIGHT);
        scope.spawn(move || {
            // Segments cut, not yet hashed.
            let send = |batch: io::Result<Vec<Vec<u8>>>| {
                let (done, hashed) = mpsc::sync_channel(1);
                rayon::spawn(move || {
                    let _ = done.send(batch.map(|b| {
                        b.into_iter()
                            .map(|s| {
                                let fp = HASH.fingerprint(&s);
                                (s, fp)
                            })
                            .collect()
                    }));
                });
                tx.send(hashed).is_ok()
            };
            let mut batch = Vec::with_capacity(BATCH);
            for segment in Segmenter::new(how, BufReader::with_capacity(1 << 20, reader)) {
                match segment {
                    Ok(s) => {
                        batch.push(s);
                        if batch.len() == BATCH
                            && !send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))))
                        {
                            return; // the appender stopped
                        }
                    }
                    Err(e) => {
                        send(Err(e));
                        return;
                    }
                }
            }
            if !batch.is_empty() {
                send(Ok(batch));
            }
        });
        // Dropping `rx` on an error stops the reader at its next send.
        for hashed in rx {
            // The pool always answers unless hashing panicked (a bug).
            let batch = hashed
                .recv()
                .map_err(|_| StreamError::Read(io::Error::other("a hashing job died")))?;
            for (data, fp) in batch.map_err(StreamError::Read)? {
                session
                    .append_hashed(&data, fp)
                    .map_err(StreamError::Repo)?;
            }
        }
        Ok(())
    })
}
