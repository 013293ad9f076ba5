//! Reading a stored tree object entry by entry, for a backup that walks
//! its parent's tree alongside its own (`tree/parent.rs`): the entries
//! are decompressed a window at a time and handed out one by one, so what
//! is held is the object as stored (10-25 bytes an entry, compressed),
//! zstd's window, and at most [`MAX_WINDOW`] bytes of decompressed
//! entries: never the decoded tree, whatever its size.
//!
//! A parent is advice, as the index is: what a reader cannot use (a
//! damaged object, an entry that does not decode, a file whose range is
//! not where the stream is) ends the reading there, and every file after
//! it is read instead of reused. The checks that make reuse safe are
//! kept: the frame's checksum over the whole object before anything is
//! read, the stream length against the parent's recipe, and each file's
//! range against the running end of the stream, so an entry can only
//! ever point at its own bytes of the parent's stream.

use std::io::{Cursor, Read};

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{unframe_any, Reader, MAX_EXPANSION};
use crate::repo::Repository;
use crate::tree::{check_path, decode_entry, entry_len, Kind, Node, MAGIC, PLAIN_VERSION, VERSION};

/// Decompressed bytes asked for at a time.
const CHUNK: usize = 64 << 10;

/// The most decompressed bytes held: an entry longer than this (only
/// extended attributes can make one; Linux caps a path at 4 KiB) ends
/// the reading, and the files after it are read, not reused.
pub const MAX_WINDOW: usize = 4 << 20;

pub(crate) struct TreeReader {
    object: String,
    raw: Box<dyn Read + Send>,
    /// Decompressed bytes not handed out yet start at `pos`.
    window: Vec<u8>,
    pos: usize,
    eof: bool,
    /// Entries not read yet.
    left: u64,
    /// The entry number of the next entry.
    next: u64,
    /// Where the next file's range must start.
    offset: u64,
}

impl TreeReader {
    /// Tree object `object`, checked whole against its checksum; it must
    /// hold `stream_len` bytes of stream (its backup's).
    pub(crate) fn open(repo: &Repository, object: &str, stream_len: u64) -> RepoResult<TreeReader> {
        let stored = repo.store.get(object)?;
        TreeReader::new(object, stored, stream_len)
    }

    pub(crate) fn new(object: &str, stored: Vec<u8>, stream_len: u64) -> RepoResult<TreeReader> {
        let corrupt = |d: String| RepoError::corrupt(object, d);
        let (version, body) = unframe_any(object, MAGIC, PLAIN_VERSION..=VERSION, &stored)?;
        let body_len = body.len() as u64;
        // The body starts after the magic and version, ends before the sum.
        let mut at = Cursor::new(stored);
        at.set_position(12);
        let raw: Box<dyn Read + Send> = if version == VERSION {
            let mut len = [0u8; 8];
            at.read_exact(&mut len)
                .map_err(|_| corrupt("no raw length".into()))?;
            let raw_len = u64::from_le_bytes(len);
            if raw_len > (body_len - 8).saturating_mul(MAX_EXPANSION) {
                return Err(corrupt(format!(
                    "its compressed body names {raw_len} bytes, over {MAX_EXPANSION} times its {}",
                    body_len - 8
                )));
            }
            let packed = at.take(body_len - 8);
            let decoder = zstd::stream::read::Decoder::new(packed)
                .map_err(|e| crate::framed::undecompressable(object, &e))?;
            Box::new(decoder.take(raw_len))
        } else {
            Box::new(at.take(body_len))
        };
        let mut reader = TreeReader {
            object: object.to_string(),
            raw,
            window: Vec::new(),
            pos: 0,
            eof: false,
            left: 2,
            next: 0,
            offset: 0,
        };
        let head = reader.take(16, |r| Ok((r.u64()?, r.u64()?)))?;
        let (found, count) = head.ok_or_else(|| corrupt("shorter than its head".into()))?;
        if found != stream_len {
            return Err(corrupt(format!(
                "its files hold {found} bytes, but its backup read {stream_len}"
            )));
        }
        reader.left = count;
        Ok(reader)
    }

    /// The next entry; `None` at the end, or from the first entry that
    /// cannot be used on (see the module doc).
    pub(crate) fn next_entry(&mut self) -> Option<Node> {
        if self.left == 0 {
            return None;
        }
        // Lent out for the errors' sake, not copied for every entry.
        let object = std::mem::take(&mut self.object);
        let node = self.entry(&object, self.next).ok();
        self.object = object;
        let usable = node.as_ref().is_some_and(|n| {
            check_path(&n.path).is_ok() && (n.kind != Kind::File || n.offset == self.offset)
        });
        let Some(n) = node.filter(|_| usable) else {
            self.left = 0;
            return None;
        };
        if n.kind == Kind::File {
            self.offset = self.offset.saturating_add(n.size);
        }
        self.left -= 1;
        self.next += 1;
        Some(n)
    }

    /// Decompressed bytes held now.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.window.capacity()
    }

    fn entry(&mut self, object: &str, i: u64) -> RepoResult<Node> {
        loop {
            let mut r = Reader::new(object, &self.window[self.pos..]);
            match decode_entry(object, &mut r, i) {
                Ok(n) => {
                    self.pos += entry_len(&n);
                    return Ok(n);
                }
                Err(e) if self.eof || self.window.len() - self.pos >= MAX_WINDOW => return Err(e),
                Err(_) => self.fill()?,
            }
        }
    }

    /// `n` bytes decoded by `f`, once that many are at hand; `None` if
    /// the body ends first.
    fn take<T>(
        &mut self,
        n: usize,
        f: impl FnOnce(&mut Reader) -> RepoResult<T>,
    ) -> RepoResult<Option<T>> {
        while self.window.len() - self.pos < n {
            if self.eof {
                return Ok(None);
            }
            self.fill()?;
        }
        let mut r = Reader::new(&self.object, &self.window[self.pos..self.pos + n]);
        let v = f(&mut r)?;
        self.pos += n;
        Ok(Some(v))
    }

    /// Drop what was handed out and decompress up to `CHUNK` bytes more.
    fn fill(&mut self) -> RepoResult<()> {
        self.window.drain(..self.pos);
        self.pos = 0;
        let had = self.window.len();
        self.window.resize(had + CHUNK, 0);
        let got = self.raw.read(&mut self.window[had..]);
        let got = got.map_err(|e| crate::framed::undecompressable(&self.object, &e))?;
        self.window.truncate(had + got);
        self.eof = got == 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    fn tree(files: u64, xattr: usize) -> Tree {
        let mut nodes = vec![Node::new("d", Kind::Dir)];
        for i in 0..files {
            let mut n = Node::new(format!("d/f{i:06}"), Kind::File);
            (n.size, n.offset, n.inode) = (10, i * 10, 7 + i);
            n.xattrs = vec![(b"user.x".to_vec(), vec![i as u8; xattr])];
            nodes.push(n);
        }
        Tree {
            stream_len: files * 10,
            nodes,
        }
    }

    fn read_all(r: &mut TreeReader) -> Vec<Node> {
        std::iter::from_fn(|| r.next_entry()).collect()
    }

    #[test]
    fn a_parent_tree_is_read_entry_by_entry_in_a_bounded_window() {
        let t = tree(50_000, 20);
        let stored = t.encode();
        let mut r = TreeReader::new("t", stored, t.stream_len).unwrap();
        let mut most = 0;
        let mut got = Vec::new();
        while let Some(n) = r.next_entry() {
            most = most.max(r.held_bytes());
            got.push(n);
        }
        assert_eq!(got, t.nodes);
        // 50,000 entries of 120 bytes are 6 MB decoded: a chunk is held.
        assert!(most <= 2 * CHUNK, "held {most} bytes");
    }

    #[test]
    fn a_parent_tree_of_another_stream_or_damaged_is_refused_or_cut_short() {
        let t = tree(100, 0);
        let stored = t.encode();
        assert!(TreeReader::new("t", stored.clone(), 999).is_err());
        let mut flipped = stored.clone();
        flipped[30] ^= 1;
        assert!(TreeReader::new("t", flipped, t.stream_len).is_err());
        // A file whose range is not where the stream is: the reading ends
        // before it (the tree is well framed, so only its entries tell).
        let mut bad = t.clone();
        bad.nodes[51].offset += 1;
        let mut r = TreeReader::new("t", bad.encode(), t.stream_len).unwrap();
        assert_eq!(read_all(&mut r), t.nodes[..51]);
        // An old tree, framed plain, reads the same.
        let mut body = t.stream_len.to_le_bytes().to_vec();
        body.extend_from_slice(&(t.nodes.len() as u64).to_le_bytes());
        for n in &t.nodes {
            crate::tree::encode_entry(n, &mut body);
        }
        let plain = crate::framed::frame(MAGIC, PLAIN_VERSION, &body);
        let mut r = TreeReader::new("t", plain, t.stream_len).unwrap();
        assert_eq!(read_all(&mut r), t.nodes);
    }
}
