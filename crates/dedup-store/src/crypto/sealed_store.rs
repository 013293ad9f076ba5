//! `SealedStore`: the object-store seam over another store, every object
//! sealed (`sealed.rs`) on its way in and opened on its way out, so the
//! repository above it reads and writes plain bytes and the store below
//! (a directory, a bucket) holds nothing a reader without the key can
//! use. Names pass through unchanged; they hold only kinds, ids, random
//! nonces and the backup names a user chose.
//!
//! A ranged read fetches the sealed frames that hold the range, in one
//! request that also brings the object's size (`get_upto`), because a
//! frame's place depends on where the object ends.

use std::sync::{Arc, Mutex};

use super::keys::MasterKey;
use super::sealed::{open, seal_into, Layout, ObjectKey, FRAME, SEALED_FRAME};
use crate::config::KeyedOf;
use crate::error::{Error, Result};
use crate::objects::{whole_range, ObjectStore};
use crate::segment_hash::SegmentHash;

pub struct SealedStore {
    inner: Arc<dyn ObjectStore>,
    key: ObjectKey,
    hash: SegmentHash,
    /// Buffers of earlier puts, sealed into again (`seal_into`).
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept for puts: one per container being put at once, about.
const SPARE_BUFFERS: usize = 4;

impl SealedStore {
    /// `inner` with every object sealed under `master`'s object key, and
    /// segments fingerprinted with its fingerprint key over what
    /// `keyed_of` says (the config's).
    pub fn new(inner: Arc<dyn ObjectStore>, master: &MasterKey, keyed_of: KeyedOf) -> SealedStore {
        SealedStore {
            inner,
            key: master.object_key(),
            hash: SegmentHash::keyed(master.fingerprint_key(), keyed_of),
            spare: Mutex::new(Vec::new()),
        }
    }

    fn layout(&self, name: &str, sealed: u64) -> Result<Layout> {
        Layout::of_sealed(sealed).ok_or_else(|| {
            Error::corrupt(
                name,
                format!(
                    "{sealed} bytes is no sealed object's size: it was cut short or is not sealed"
                ),
            )
        })
    }

    /// The plain bytes of the whole sealed object `name`, read already.
    pub(crate) fn open_whole(&self, name: &str, sealed: Vec<u8>) -> Result<Vec<u8>> {
        let layout = self.layout(name, sealed.len() as u64)?;
        open(&self.key, name, layout, 0, sealed, 0)
    }
}

/// The store below answered with fewer (or more) bytes than the size it
/// gave: refused by name rather than sliced.
fn short(name: &str, got: usize) -> Error {
    Error::corrupt(
        name,
        format!("the store answered {got} bytes, which do not fit the size it gave"),
    )
}

impl ObjectStore for SealedStore {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let spare = |s: &Mutex<Vec<Vec<u8>>>| s.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut buf = spare(&self.spare).unwrap_or_default();
        seal_into(&self.key, name, bytes, &mut buf)?;
        let put = self.inner.put(name, &buf);
        let mut kept = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < SPARE_BUFFERS {
            kept.push(buf);
        }
        put
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.open_whole(name, self.inner.get(name)?)
    }

    /// The copy the store below keeps is the sealed one: opened (and so
    /// authenticated) here as a read would be.
    fn get_listed(&self, name: &str, tag: &str) -> Result<Vec<u8>> {
        self.open_whole(name, self.inner.get_listed(name, tag)?)
    }

    fn forget_listed(&self, name: &str, tag: &str) {
        self.inner.forget_listed(name, tag)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        whole_range(name, offset, len, self.get_upto(name, offset, len)?)
    }

    fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
        let first = offset / FRAME;
        let end = offset.saturating_add(len);
        let frames = end.div_ceil(FRAME).max(first + 1) - first;
        let got = self.inner.get_upto(
            name,
            first * SEALED_FRAME,
            frames.saturating_mul(SEALED_FRAME),
        );
        let (sealed, size) = match got {
            // At the end of an object of whole frames, the frame after
            // the last starts past the sealed end.
            Err(Error::OutOfRange { size, .. }) => (Vec::new(), size),
            other => other?,
        };
        let layout = self.layout(name, size)?;
        if offset > layout.plain {
            return Err(Error::out_of_range(name, offset, len, layout.plain));
        }
        let mut plain = open(&self.key, name, layout, first, sealed, 0)?;
        let from = (offset - first * FRAME) as usize;
        let to = (end.min(layout.plain) - first * FRAME) as usize;
        if from > to || to > plain.len() {
            return Err(short(name, plain.len()));
        }
        plain.copy_within(from..to, 0);
        plain.truncate(to - from);
        Ok((plain, layout.plain))
    }

    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.get_tail_sized(name, len).map(|(bytes, _)| bytes)
    }

    /// The last frame is 0 to 64 KiB of plain bytes, so the sealed tail
    /// of `ceil(len / 64 KiB) + 1` frames' length holds every frame of
    /// the plain tail.
    fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        let want = (len.div_ceil(FRAME) + 1).saturating_mul(SEALED_FRAME);
        let (sealed, size) = self.inner.get_tail_sized(name, want)?;
        let layout = self.layout(name, size)?;
        // The first whole frame in what came back.
        let start =
            (size.checked_sub(sealed.len() as u64)).ok_or_else(|| short(name, sealed.len()))?;
        let first = start.div_ceil(SEALED_FRAME);
        let skip = (first * SEALED_FRAME - start) as usize;
        if skip > sealed.len() {
            return Err(short(name, sealed.len()));
        }
        let mut plain = open(&self.key, name, layout, first, sealed, skip)?;
        let keep = len.min(layout.plain) as usize;
        if keep > plain.len() {
            return Err(short(name, plain.len()));
        }
        plain.drain(..plain.len() - keep);
        Ok((plain, layout.plain))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.list(prefix)
    }

    fn list_after(&self, prefix: &str, after: &str) -> Result<Vec<String>> {
        self.inner.list_after(prefix, after)
    }

    fn list_tagged(&self, prefix: &str) -> Result<Vec<(String, Option<String>)>> {
        self.inner.list_tagged(prefix)
    }

    fn list_sized(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        Ok((self.inner.list_sized(prefix)?.into_iter())
            .map(|(name, size)| (name, Layout::plain_size(size)))
            .collect())
    }

    fn size(&self, name: &str) -> Result<u64> {
        Ok(Layout::plain_size(self.inner.size(name)?))
    }

    fn segment_hash(&self) -> SegmentHash {
        self.hash
    }

    fn read_granule(&self) -> u64 {
        self.inner.read_granule()
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }
}
