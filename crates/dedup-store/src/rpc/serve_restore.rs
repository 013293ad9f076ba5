//! The server's side of a restore: backup `name`'s stream sent as
//! `Chunk`s as it is read, past damage as a restore beside the repository
//! goes (`restore/salvage.rs`): each range that cannot be restored is sent
//! as a `Damaged` in its place (its offset, length and why; the client
//! writes the zeros), then `Restored` with the stream's length. A backup
//! or recipe object that cannot be read still ends the restore with the
//! repository's error: nothing of the stream can be found without it.

use std::io::{self, Write};

use super::connection::{repo_err, send};
use super::protocol::{Reply, RESTORE_CHUNK};
use crate::repo::Repository;
use crate::restore::{writing, Piece};

/// Send backup `name`, answering request `id`; an error only if the
/// connection failed (the restore's own errors are sent).
pub(super) fn restore(
    repo: &Repository,
    name: &str,
    id: u64,
    w: &mut impl Write,
) -> io::Result<()> {
    let mut out = Chunks {
        w: &mut *w,
        id,
        buf: Vec::with_capacity(RESTORE_CHUNK),
        sent: 0,
    };
    // Why the connection failed, if it did: the restore stops on it, and
    // so does the connection.
    let mut lost: Option<io::Error> = None;
    let done = repo.recipe_parts(name).and_then(|(_, parts)| {
        repo.restore_pieces(name, parts, None, &mut |piece| {
            let sent = match piece {
                Piece::Data(data) => out.write_all(data),
                Piece::Damaged(len, e) => out.damaged(len, e.to_string()),
                // Nothing is skipped when every byte is wanted.
                Piece::Skipped(_) => Ok(()),
            };
            sent.map_err(|e| {
                let stop = writing(name, io::Error::new(e.kind(), e.to_string()));
                lost = Some(e);
                stop
            })
        })
    });
    if let Some(e) = lost {
        return Err(e);
    }
    let reply = match done {
        Ok(()) => {
            out.emit()?;
            Ok(Reply::Restored { bytes: out.sent })
        }
        Err(e) => Err(repo_err(e)),
    };
    send(w, id, reply)
}

/// A `Write` that sends what it is given as `Chunk` responses.
struct Chunks<'w, W: Write> {
    w: &'w mut W,
    id: u64,
    buf: Vec<u8>,
    /// Bytes of the stream sent, damaged ranges counted.
    sent: u64,
}

impl<W: Write> Chunks<'_, W> {
    fn emit(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(RESTORE_CHUNK));
        self.sent += chunk.len() as u64;
        send(&mut *self.w, self.id, Ok(Reply::Chunk(chunk)))
    }

    /// Name the next `len` bytes as damaged, after the bytes before them.
    fn damaged(&mut self, len: u64, error: String) -> io::Result<()> {
        self.emit()?;
        let offset = self.sent;
        self.sent += len;
        send(
            &mut *self.w,
            self.id,
            Ok(Reply::Damaged { offset, len, error }),
        )
    }
}

impl<W: Write> Write for Chunks<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(RESTORE_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == RESTORE_CHUNK {
            self.emit()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.emit()
    }
}
