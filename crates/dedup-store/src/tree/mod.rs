//! The tree object of a backup of files and directories: every entry's
//! path and metadata, in walk order, each regular file naming the range of
//! the backup's stream that holds its contents (the stream is every
//! regular file's contents back to back, in the same order).
//!
//! Object `trees/<backup>-<nonce>`, framed (magic `DDUPTREE`), version 2:
//! the body below compressed with zstd behind its raw length (see
//! `framed::frame_compressed`; a body that would expand more than 64
//! times is written plain, as version 1, which is also still read).
//! The compressed body may be several zstd frames back to back, read as
//! one (a backup writes its entries' frame as it walks, and the frame of
//! the length and count before it at the end: `tree/writer.rs`).
//! Body: stream length (u64), entry count n (u64), then n entries of
//!
//! | Size | Field                                                       |
//! |-----:|-------------------------------------------------------------|
//! | 1    | kind: 1 dir, 2 file, 3 symlink, 4 hard link, 5 fifo, 6 char device, 7 block device |
//! | 4    | mode: the 12 permission bits (setuid, setgid, sticky, rwx)  |
//! | 4, 4 | uid, gid                                                    |
//! | 8, 4 | mtime: seconds (i64) since the epoch, nanoseconds (< 10^9)  |
//! | 8, 4 | atime: the same                                             |
//! | 8, 4 | ctime: the same (for finding unchanged files next time)     |
//! | 8    | inode (files), else 0                                       |
//! | 8    | size: bytes of the stream (files), else 0                   |
//! | 8    | offset in the stream (files), else 0                        |
//! | 8    | rdev (devices), else 0                                      |
//! | 2+p  | path: u16 length, bytes                                     |
//! | 2+t  | target: symlink target, first path of a hard link, else empty |
//! | 2    | xattr count x, then x × (u16 name length, name, u32 value length, value) |
//!
//! A tree read from a store is untrusted: `decode` checks the frame, every
//! length before it is used, and then that the entries make a tree a
//! restore can follow without leaving its target (see [`Tree::check`]).

use std::collections::HashMap;

pub(crate) mod backup;
mod commit;
pub(crate) mod cut;
pub(crate) mod parent;
pub(crate) mod reader;
pub(crate) mod restore;
pub mod walk;
pub(crate) mod writer;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame_compressed, unframe_compressed, Reader};

pub(crate) const MAGIC: [u8; 8] = *b"DDUPTREE";
/// Version 2 keeps the body compressed with zstd (a tree's paths share
/// long prefixes: 11 times smaller on 21,448 files); version 1, as is,
/// is still read.
pub(crate) const VERSION: u32 = 2;
pub(crate) const PLAIN_VERSION: u32 = 1;
/// Bytes of an entry with an empty path, target and no xattrs.
const MIN_ENTRY: usize = 1 + 4 * 3 + 12 * 3 + 8 * 4 + 2 * 3;
/// Longest path or symlink target (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// Another name of an earlier entry (same device and inode); its
    /// contents are not repeated.
    HardLink,
    Fifo,
    CharDev,
    BlockDev,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Dir => 1,
            Kind::File => 2,
            Kind::Symlink => 3,
            Kind::HardLink => 4,
            Kind::Fifo => 5,
            Kind::CharDev => 6,
            Kind::BlockDev => 7,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Dir,
            2 => Kind::File,
            3 => Kind::Symlink,
            4 => Kind::HardLink,
            5 => Kind::Fifo,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// Seconds since the epoch and nanoseconds, as `stat` gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// One file, directory, symlink, hard link or special file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Relative, `/`-separated, no empty, `.` or `..` component. Bytes,
    /// not UTF-8: Unix names are bytes.
    pub path: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Time,
    pub atime: Time,
    /// Change time: with mtime, size and inode, what says a file is
    /// unchanged since the parent backup (its contents are then reused
    /// without being read).
    pub ctime: Time,
    /// Files only (0 otherwise).
    pub inode: u64,
    pub size: u64,
    pub offset: u64,
    pub rdev: u64,
    pub target: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    /// An entry of `kind` at `path` with everything else zero.
    pub fn new(path: impl Into<Vec<u8>>, kind: Kind) -> Node {
        Node {
            path: path.into(),
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime: Time::default(),
            atime: Time::default(),
            ctime: Time::default(),
            inode: 0,
            size: 0,
            offset: 0,
            rdev: 0,
            target: Vec::new(),
            xattrs: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    /// Bytes of the backup's stream: the sum of the files' sizes.
    pub stream_len: u64,
    pub nodes: Vec<Node>,
}

impl Tree {
    /// The tree of backup `name` holds exactly the `bytes_in` bytes the
    /// backup read; the damage in words if not. Checked when a tree is
    /// committed and again when it is restored.
    pub fn check_stream_len(&self, name: &str, bytes_in: u64) -> Result<(), String> {
        check_stream_len(self.stream_len, name, bytes_in)
    }

    /// Encode as is: `encode` does not check (so tests can build bad
    /// trees); `decode` does.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.stream_len.to_le_bytes());
        b.extend_from_slice(&(self.nodes.len() as u64).to_le_bytes());
        for n in &self.nodes {
            encode_entry(n, &mut b);
        }
        frame_compressed(MAGIC, PLAIN_VERSION, VERSION, &b)
    }

    /// Decode and check the tree object `object`.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Tree> {
        let body = unframe_compressed(object, MAGIC, PLAIN_VERSION, VERSION, bytes)?;
        let body = &body[..];
        let mut r = Reader::new(object, body);
        let stream_len = r.u64()?;
        let count = r.u64()?;
        // Every entry takes MIN_ENTRY bytes: a count that cannot fit is
        // refused before anything is allocated for it.
        if count > (body.len() / MIN_ENTRY) as u64 {
            return Err(RepoError::corrupt(
                object,
                format!("{count} entries do not fit its {} bytes", body.len()),
            ));
        }
        let mut nodes = Vec::with_capacity(count as usize);
        for i in 0..count {
            nodes.push(decode_entry(object, &mut r, i)?);
        }
        r.finish()?;
        let tree = Tree { stream_len, nodes };
        tree.check()
            .map_err(|detail| RepoError::corrupt(object, detail))?;
        Ok(tree)
    }

    /// Whether the entries make a tree that restores inside its target:
    /// every path is relative and clean, unique, and its parent is an
    /// earlier directory (so nothing is ever created through a symlink);
    /// a hard link names an earlier entry that is not a directory or a
    /// link; the files' ranges tile the stream in order; fields that do
    /// not belong to a kind are zero. The first fault, in words.
    pub fn check(&self) -> Result<(), String> {
        let mut seen: HashMap<&[u8], Kind> = HashMap::with_capacity(self.nodes.len());
        let mut offset = 0u64;
        for (i, n) in self.nodes.iter().enumerate() {
            let at = || format!("entry {i} ({})", String::from_utf8_lossy(&n.path));
            check_path(&n.path).map_err(|e| format!("{}: path {e}", at()))?;
            if let Some(cut) = n.path.iter().rposition(|&b| b == b'/') {
                if seen.get(&n.path[..cut]) != Some(&Kind::Dir) {
                    return Err(format!("{}: its parent is not an earlier directory", at()));
                }
            }
            if n.mode > 0o7777 {
                return Err(format!("{}: mode {:o} has more than 12 bits", at(), n.mode));
            }
            if [n.mtime, n.atime, n.ctime]
                .iter()
                .any(|t| t.nsec >= 1_000_000_000)
            {
                return Err(format!("{}: nanoseconds out of range", at()));
            }
            let content = n.kind == Kind::File;
            if !content && (n.size != 0 || n.offset != 0 || n.inode != 0) {
                return Err(format!("{}: a {:?} has no contents", at(), n.kind));
            }
            if content {
                if n.offset != offset {
                    return Err(format!(
                        "{}: offset {} where the stream is at {offset}",
                        at(),
                        n.offset
                    ));
                }
                offset = offset
                    .checked_add(n.size)
                    .ok_or_else(|| format!("{}: size overflows", at()))?;
            }
            if !matches!(n.kind, Kind::CharDev | Kind::BlockDev) && n.rdev != 0 {
                return Err(format!("{}: rdev on a {:?}", at(), n.kind));
            }
            match n.kind {
                Kind::Symlink
                    if n.target.is_empty()
                        || n.target.len() > MAX_PATH
                        || n.target.contains(&0) =>
                {
                    return Err(format!("{}: bad symlink target", at()));
                }
                Kind::Symlink => {}
                Kind::HardLink => match seen.get(n.target.as_slice()) {
                    Some(Kind::Dir | Kind::HardLink) | None => {
                        return Err(format!(
                            "{}: hard link to {:?}, not an earlier file",
                            at(),
                            String::from_utf8_lossy(&n.target)
                        ))
                    }
                    Some(_) => {}
                },
                _ if !n.target.is_empty() => {
                    return Err(format!("{}: a target on a {:?}", at(), n.kind))
                }
                _ => {}
            }
            if seen.insert(&n.path, n.kind).is_some() {
                return Err(format!("{}: path repeated", at()));
            }
        }
        if offset != self.stream_len {
            return Err(format!(
                "its files hold {offset} bytes, not the stream's {}",
                self.stream_len
            ));
        }
        Ok(())
    }
}

/// [`Tree::check_stream_len`] of a tree whose files hold `stream_len`.
pub(crate) fn check_stream_len(stream_len: u64, name: &str, bytes_in: u64) -> Result<(), String> {
    if stream_len != bytes_in {
        return Err(format!(
            "its files hold {stream_len} bytes, but backup {name} read {bytes_in}"
        ));
    }
    Ok(())
}

/// Append entry `n` as the table above lays it out.
pub(crate) fn encode_entry(n: &Node, b: &mut Vec<u8>) {
    b.push(n.kind.code());
    for v in [n.mode, n.uid, n.gid] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for t in [n.mtime, n.atime, n.ctime] {
        b.extend_from_slice(&t.sec.to_le_bytes());
        b.extend_from_slice(&t.nsec.to_le_bytes());
    }
    for v in [n.inode, n.size, n.offset, n.rdev] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    put_bytes16(b, &n.path);
    put_bytes16(b, &n.target);
    b.extend_from_slice(&(n.xattrs.len() as u16).to_le_bytes());
    for (name, value) in &n.xattrs {
        put_bytes16(b, name);
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
    }
}

/// The bytes `encode_entry` takes for `n`.
pub(crate) fn entry_len(n: &Node) -> usize {
    let xattrs: usize = n
        .xattrs
        .iter()
        .map(|(k, v)| 2 + k.len() + 4 + v.len())
        .sum();
    MIN_ENTRY + n.path.len() + n.target.len() + xattrs
}

/// Read entry number `i` of `object` (its fields only: what makes a tree
/// of the entries is [`Tree::check`]'s).
pub(crate) fn decode_entry(object: &str, r: &mut Reader, i: u64) -> RepoResult<Node> {
    let code = r.bytes(1)?[0];
    let kind = Kind::from_code(code)
        .ok_or_else(|| RepoError::corrupt(object, format!("entry {i}: unknown kind {code}")))?;
    let (mode, uid, gid) = (r.u32()?, r.u32()?, r.u32()?);
    let mtime = time(r)?;
    let atime = time(r)?;
    let ctime = time(r)?;
    let inode = r.u64()?;
    let (size, offset, rdev) = (r.u64()?, r.u64()?, r.u64()?);
    let path = bytes16(r)?;
    let target = bytes16(r)?;
    let x = r.u16()?;
    let mut xattrs = Vec::new();
    for _ in 0..x {
        let name = bytes16(r)?;
        let len = r.u32()? as usize;
        xattrs.push((name, r.bytes(len)?.to_vec()));
    }
    Ok(Node {
        path,
        kind,
        mode,
        uid,
        gid,
        mtime,
        atime,
        ctime,
        inode,
        size,
        offset,
        rdev,
        target,
        xattrs,
    })
}

/// A relative path with no empty, `.` or `..` component and no NUL.
pub fn check_path(p: &[u8]) -> Result<(), &'static str> {
    if p.is_empty() || p.len() > MAX_PATH {
        return Err("empty or too long");
    }
    if p.contains(&0) {
        return Err("holds NUL");
    }
    if p[0] == b'/' {
        return Err("is absolute");
    }
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" => return Err("has an empty component"),
            b"." | b".." => return Err("has a . or .. component"),
            _ => {}
        }
    }
    Ok(())
}

fn time(r: &mut Reader) -> RepoResult<Time> {
    Ok(Time {
        sec: r.u64()? as i64,
        nsec: r.u32()?,
    })
}

fn bytes16(r: &mut Reader) -> RepoResult<Vec<u8>> {
    let n = r.u16()? as usize;
    Ok(r.bytes(n)?.to_vec())
}

/// Lengths over u16 cannot occur: paths, targets and xattr names are
/// checked against `MAX_PATH` / 255 by the walk.
fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests;
