//! Writing a tree object entry by entry, as the walk finds them, so a
//! backup of files never holds its tree decoded: each entry is compressed
//! as soon as it is complete, and what stays in RAM is the compressed
//! tree (10-25 bytes an entry: 2.5 MB for the 104,000 files of
//! `/usr/share` and `/usr/lib`, where the decoded entries, their encoding
//! and the check of it took some 100 MB) and zstd's window.
//!
//! The object is the one `tree/mod.rs` describes, version 2, byte for byte a
//! reader's equal: the compressed body is two zstd frames back to back,
//! the entries' and, before it, one of the stream length and entry count,
//! which are known only at the end (zstd decompresses concatenated frames
//! as one stream, so `Tree::decode` reads it as it reads any other).

use crate::format::crc;
use crate::framed::{frame, MAX_EXPANSION, OBJECT_LEVEL};
use crate::tree::{encode_entry, Kind, Node, Tree, MAGIC, PLAIN_VERSION, VERSION};

/// A tree object being written.
pub struct TreeWriter {
    entries: zstd::stream::write::Encoder<'static, Vec<u8>>,
    /// One entry's encoding, reused.
    scratch: Vec<u8>,
    count: u64,
    /// Raw bytes of the entries so far.
    raw: u64,
    /// Bytes of the stream the files so far hold.
    stream_len: u64,
}

/// A tree object, encoded, with what the commit checks it against.
#[derive(Clone, Debug)]
pub struct EncodedTree {
    pub bytes: Vec<u8>,
    /// Bytes of the backup's stream its files hold.
    pub stream_len: u64,
    pub entries: u64,
}

impl EncodedTree {
    /// Decoded and checked, as a restore reads it (for tests and tools:
    /// this is the whole tree in RAM).
    pub fn decode(&self) -> crate::error::repo::RepoResult<Tree> {
        Tree::decode("a walked tree", &self.bytes)
    }
}

impl Default for TreeWriter {
    fn default() -> TreeWriter {
        TreeWriter::new()
    }
}

impl TreeWriter {
    pub fn new() -> TreeWriter {
        let entries = zstd::stream::write::Encoder::new(Vec::new(), OBJECT_LEVEL)
            .expect("zstd starts with a good level");
        TreeWriter {
            entries,
            scratch: Vec::new(),
            count: 0,
            raw: 0,
            stream_len: 0,
        }
    }

    /// Append entry `n`, complete (a file's size final). A file's range
    /// must start where the stream is: the caller writes files in stream
    /// order.
    pub fn push(&mut self, n: &Node) {
        if n.kind == Kind::File {
            debug_assert_eq!(n.offset, self.stream_len, "files in stream order");
            self.stream_len += n.size;
        }
        self.scratch.clear();
        encode_entry(n, &mut self.scratch);
        std::io::Write::write_all(&mut self.entries, &self.scratch)
            .expect("zstd compresses into memory");
        self.count += 1;
        self.raw += self.scratch.len() as u64;
    }

    /// Entries written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Compressed bytes held so far (zstd's window and buffers apart).
    pub fn held_bytes(&self) -> usize {
        self.entries.get_ref().len()
    }

    /// The tree object.
    pub fn finish(self) -> EncodedTree {
        let mut head = self.stream_len.to_le_bytes().to_vec();
        head.extend_from_slice(&self.count.to_le_bytes());
        let raw_len = head.len() as u64 + self.raw;
        let entries = self.entries.finish().expect("zstd compresses into memory");
        let head_z = zstd::bulk::compress(&head, OBJECT_LEVEL).expect("zstd compresses in memory");
        let packed = (head_z.len() + entries.len()) as u64;
        let bytes = if raw_len > packed.saturating_mul(MAX_EXPANSION) {
            // Compresses too well for a reader to accept it compressed (a
            // forged body could name any length): framed plain, as
            // `frame_compressed` would.
            let raw = zstd::decode_all(&entries[..]).expect("zstd decompresses what it compressed");
            head.extend_from_slice(&raw);
            frame(MAGIC, PLAIN_VERSION, &head)
        } else {
            let mut out = Vec::with_capacity(12 + 8 + head_z.len() + entries.len() + 4);
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&VERSION.to_le_bytes());
            out.extend_from_slice(&raw_len.to_le_bytes());
            out.extend_from_slice(&head_z);
            out.extend_from_slice(&entries);
            let sum = crc(&out);
            out.extend_from_slice(&sum.to_le_bytes());
            out
        };
        EncodedTree {
            bytes,
            stream_len: self.stream_len,
            entries: self.count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: u64) -> Tree {
        let mut nodes = vec![Node::new("d", Kind::Dir)];
        for i in 0..files {
            let mut n = Node::new(format!("d/f{i}"), Kind::File);
            (n.size, n.offset, n.inode) = (i + 1, i * (i + 1) / 2, 100 + i);
            n.xattrs = vec![(b"user.x".to_vec(), vec![i as u8; 3])];
            nodes.push(n);
        }
        nodes.push(Node::new("d/s", Kind::Symlink));
        nodes.last_mut().unwrap().target = b"f0".to_vec();
        Tree {
            stream_len: files * (files + 1) / 2,
            nodes,
        }
    }

    #[test]
    fn a_tree_written_entry_by_entry_decodes_as_the_tree_encoded_whole() {
        for files in [0, 1, 2000] {
            let t = tree(files);
            let mut w = TreeWriter::new();
            for n in &t.nodes {
                w.push(n);
            }
            let e = w.finish();
            assert_eq!(
                (e.stream_len, e.entries),
                (t.stream_len, t.nodes.len() as u64)
            );
            assert_eq!(Tree::decode("t", &e.bytes).unwrap(), t, "{files} files");
        }
    }

    #[test]
    fn a_tree_that_compresses_too_well_is_written_plain() {
        let mut w = TreeWriter::new();
        let mut n = Node::new("a", Kind::Dir);
        n.xattrs = vec![(b"user.big".to_vec(), vec![0; 60_000])];
        w.push(&n);
        let e = w.finish();
        assert_eq!(e.bytes[8..12], PLAIN_VERSION.to_le_bytes());
        assert_eq!(e.decode().unwrap().nodes, vec![n]);
    }
}
