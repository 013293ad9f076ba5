//! The object-store seam: the few operations the backup store needs from
//! whatever keeps its containers. They are chosen so that an S3-like store
//! can implement them directly (PUT with If-None-Match, GET, ranged GET,
//! suffix-ranged GET, LIST by prefix, DELETE); `LocalDir` is the local one.
//!
//! Objects are immutable: once `put` succeeds the name holds those bytes
//! until `delete`, and a second `put` of the name is refused. A reader
//! therefore never sees half an object, and caches never go stale.

use crate::error::{Error, Result};
use crate::segment_hash::SegmentHash;

pub trait ObjectStore: Send + Sync {
    /// Store `bytes` under `name`, atomically and durably: when this returns
    /// `Ok` the whole object survives a crash; before, it is invisible.
    /// `Error::Exists` if the name is already stored, except that a store
    /// that settles unknown outcomes by reading back (S3) answers `Ok` when
    /// it already holds exactly these bytes.
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()>;

    /// The whole object. `Error::NotFound` if there is none.
    fn get(&self, name: &str) -> Result<Vec<u8>>;

    /// `len` bytes from `offset`. `Error::OutOfRange` if they reach past the end.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// The last `min(len, size)` bytes: how a container's trailer is read
    /// without first asking for the object's size (S3's `bytes=-len`).
    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>>;

    /// Up to `len` bytes from `offset`, fewer where the object ends first,
    /// and the object's size: one request on S3 (its `Content-Range`
    /// carries the size), so a reader whose layout depends on the size
    /// (sealed objects) need not ask for it first. `Error::OutOfRange` if
    /// `offset` is past the end.
    fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
        let size = self.size(name)?;
        if offset > size {
            return Err(Error::out_of_range(name, offset, len, size));
        }
        let len = len.min(size - offset);
        Ok((self.get_range(name, offset, len)?, size))
    }

    /// `get_tail` and the object's size, in one request where the store
    /// can (see `get_upto`).
    fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        let size = self.size(name)?;
        let len = len.min(size);
        Ok((self.get_range(name, size - len, len)?, size))
    }

    /// The names that start with `prefix` (a plain string prefix, as in S3),
    /// sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>>;

    /// The names that start with `prefix` and sort after `after`, sorted:
    /// what S3 lists from `start-after`, so that a listing of the newest
    /// containers does not page through all the older ones.
    fn list_after(&self, prefix: &str, after: &str) -> Result<Vec<String>> {
        let mut names = self.list(prefix)?;
        names.retain(|name| name.as_str() > after);
        Ok(names)
    }

    /// The names that start with `prefix`, sorted, each with its size in
    /// bytes (an S3 listing carries them; a directory is asked for each).
    fn list_sized(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        self.list(prefix)?
            .into_iter()
            .map(|name| Ok((name.clone(), self.size(&name)?)))
            .collect()
    }

    /// The names that start with `prefix`, sorted, each with a tag that
    /// changes whenever the object under that name does, and never names
    /// other bytes at this service (S3's ETag, the MD5 of an object put
    /// whole, which `s3/listed_cache.rs` checks before trusting it), or
    /// `None` where the store has no such tag (a directory: the default).
    /// What a handle read of an object it may trust again while the tag
    /// is the same (`repo/listing.rs`).
    fn list_tagged(&self, prefix: &str) -> Result<Vec<(String, Option<String>)>> {
        Ok(self.list(prefix)?.into_iter().map(|n| (n, None)).collect())
    }

    /// The whole object, to which the listing just gave `tag`
    /// (`list_tagged`): a store may answer from this machine's copy of
    /// it under that tag (S3: `s3/listed_cache.rs`). The default reads it.
    fn get_listed(&self, name: &str, _tag: &str) -> Result<Vec<u8>> {
        self.get(name)
    }

    /// What `get_listed` answered for `name` under `tag` did not open or
    /// decode: a store that keeps a copy drops it. The default keeps none.
    fn forget_listed(&self, _name: &str, _tag: &str) {}

    /// The object's size in bytes, without reading it. `Error::NotFound`
    /// if there is none.
    fn size(&self, name: &str) -> Result<u64>;

    /// How the segments of containers stored here are fingerprinted:
    /// plain BLAKE3, or keyed in a `SealedStore`. Required, not
    /// defaulted: a store that wraps another must answer as the one it
    /// wraps, and a default would silently answer plain.
    fn segment_hash(&self) -> SegmentHash;

    /// The size of read a restore prefers when it reads an object again
    /// (`read_windows.rs`): 0, the default, for exact reads
    /// where a read costs little (a directory's `pread`); more where each
    /// request is dear (S3). A store that wraps another answers as the
    /// one it wraps.
    fn read_granule(&self) -> u64 {
        0
    }

    /// The service and place this store's objects are in, as a stable
    /// string (an S3 store: its endpoint and bucket URL), for remembering
    /// on this machine what was found out about the service once
    /// (`repo/create_only.rs`); `None`, the default, remembers nothing.
    fn service(&self) -> Option<String> {
        None
    }

    /// Remove the object. `Error::NotFound` if there is none, on a store
    /// that can tell: S3 cannot, and answers `Ok`, so callers treat both
    /// alike.
    fn delete(&self, name: &str) -> Result<()>;
}

/// `get_range` from a `get_upto`'s answer: its bytes if all `len` came,
/// else `OutOfRange`. For stores whose one ranged read is `get_upto`.
pub(crate) fn whole_range(
    name: &str,
    offset: u64,
    len: u64,
    (bytes, size): (Vec<u8>, u64),
) -> Result<Vec<u8>> {
    if (bytes.len() as u64) < len {
        return Err(Error::out_of_range(name, offset, len, size));
    }
    Ok(bytes)
}
