//! Recipes in parts, so that a backup or a restore of a stream of any size
//! holds one part of its recipe in RAM, never the whole (at 8 KiB segments
//! a whole recipe is 3 MiB a GiB of stream: 3 GiB for a 1 TiB disk image,
//! twice that while it was encoded).
//!
//! A backup writes its recipe as it goes: every `PART_SEGMENTS` references
//! become a *part*, object `<recipe>.p<k>` (k from 0, 8 hex digits), which
//! is a recipe of its slice of the stream in the single-object format
//! (`recipe/mod.rs`, version 5). At commit the *recipe object* is then an
//! *index* (version 4 under the recipe magic) naming how many parts there
//! are and, for each, its segment count, its stream bytes and the BLAKE3 of
//! its whole object, so a part that is missing, damaged, out of place or
//! from another recipe is refused by name. A recipe that fits one part is
//! still written whole, as one object, as before.
//!
//! Parts are written before the index and the index before the backup
//! object (the commit point): a backup that dies leaves parts no backup
//! names, which GC removes as it removes any orphan recipe.
//!
//! Index body (plain, framed): stream length (u64), segment count (u64),
//! part count n (u64), then n rows of segment count (u64), stream bytes
//! (u64) and BLAKE3 of the part object (32 bytes).

use dedup_common::fingerprint::Fingerprint;

use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::framed::{frame, unframe_any};
use crate::objects::ObjectStore;
use crate::recipe::{Recipe, MAGIC, VERSIONS};
use crate::writer::HASH;

/// The recipe object as an index of parts.
pub(crate) const INDEX_VERSION: u32 = 4;

/// References a backup gathers before it writes them as a part: 1.5 MiB in
/// RAM, 512 MiB of stream at 8 KiB segments. Large enough that a part's
/// put and fsync cost nothing next to the data (two a GiB), small enough
/// that a restore or a GC holds little.
pub const PART_SEGMENTS: usize = 1 << 16;

/// One part as the index records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartInfo {
    pub segments: u64,
    pub bytes: u64,
    /// BLAKE3 of the part object's bytes.
    pub digest: [u8; 32],
}

/// A recipe object that names its parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecipeIndex {
    pub stream_len: u64,
    pub segments: u64,
    pub parts: Vec<PartInfo>,
}

const ROW: usize = 48;

impl RecipeIndex {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(24 + self.parts.len() * ROW);
        body.extend_from_slice(&self.stream_len.to_le_bytes());
        body.extend_from_slice(&self.segments.to_le_bytes());
        body.extend_from_slice(&(self.parts.len() as u64).to_le_bytes());
        for p in &self.parts {
            body.extend_from_slice(&p.segments.to_le_bytes());
            body.extend_from_slice(&p.bytes.to_le_bytes());
            body.extend_from_slice(&p.digest);
        }
        frame(MAGIC, INDEX_VERSION, &body)
    }

    /// The index in the body of a version 4 frame, its totals checked
    /// against its rows.
    fn decode_body(object: &str, body: &[u8]) -> RepoResult<RecipeIndex> {
        let corrupt = |d: String| RepoError::corrupt(object, d);
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        if body.len() < 24 {
            return Err(corrupt(format!(
                "{} bytes, too short for a recipe index",
                body.len()
            )));
        }
        let (stream_len, segments, n) = (u64_at(body, 0), u64_at(body, 8), u64_at(body, 16));
        if (n as u128) * ROW as u128 + 24 != body.len() as u128 {
            return Err(corrupt(format!(
                "{n} parts do not fit its {} bytes",
                body.len()
            )));
        }
        let parts: Vec<PartInfo> = body[24..]
            .chunks_exact(ROW)
            .map(|r| PartInfo {
                segments: u64_at(r, 0),
                bytes: u64_at(r, 8),
                digest: r[16..48].try_into().expect("32"),
            })
            .collect();
        if parts.iter().any(|p| p.segments == 0) {
            return Err(corrupt("it names a part of no segments".into()));
        }
        let total =
            |f: fn(&PartInfo) -> u64| parts.iter().try_fold(0u64, |sum, p| sum.checked_add(f(p)));
        if total(|p| p.segments) != Some(segments) {
            return Err(corrupt(format!(
                "its parts do not add up to the {segments} segments it names"
            )));
        }
        if total(|p| p.bytes) != Some(stream_len) {
            return Err(corrupt(format!(
                "its parts do not add up to the {stream_len} bytes of its stream"
            )));
        }
        Ok(RecipeIndex {
            stream_len,
            segments,
            parts,
        })
    }
}

/// A recipe object: the whole recipe, or the index of its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipeObject {
    Whole(Recipe),
    Index(RecipeIndex),
}

impl RecipeObject {
    /// Decode recipe object `object`, of any version.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<RecipeObject> {
        let (version, body) = unframe_any(object, MAGIC, VERSIONS, bytes)?;
        if version == INDEX_VERSION {
            return RecipeIndex::decode_body(object, body).map(RecipeObject::Index);
        }
        Recipe::decode_body(object, version, body).map(RecipeObject::Whole)
    }

    pub fn stream_len(&self) -> u64 {
        match self {
            RecipeObject::Whole(r) => r.stream_len,
            RecipeObject::Index(i) => i.stream_len,
        }
    }
}

/// The object of part `k` of recipe `recipe`.
pub fn part_name(recipe: &str, k: usize) -> String {
    format!("{recipe}.p{k:08x}")
}

/// The recipe a part object belongs to, and its number; `None` for any
/// other name (a recipe object's own ends in its 16-hex-digit nonce).
pub fn part_of(object: &str) -> Option<(&str, usize)> {
    let (recipe, k) = object.rsplit_once(".p")?;
    if k.len() != 8 || !k.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(k, 16).ok().map(|k| (recipe, k))
}

/// The recipe an object under `recipes/` stands for: a part's recipe, or
/// the object itself.
pub fn recipe_of(object: &str) -> &str {
    part_of(object).map_or(object, |(recipe, _)| recipe)
}

/// Digest of a part object's bytes, as the index records it.
pub fn part_digest(bytes: &[u8]) -> [u8; 32] {
    HASH.fingerprint(bytes).0
}

/// A recipe read part by part, in stream order. A whole recipe is one part
/// (named as the recipe object itself).
pub struct RecipeParts {
    object: String,
    head: RecipeObject,
    next: usize,
}

impl RecipeParts {
    /// Read recipe object `object`. Store errors (a missing object among
    /// them) are passed on as they are, for the caller to name.
    pub fn open(store: &dyn ObjectStore, object: &str) -> RepoResult<RecipeParts> {
        let bytes = store.get(object)?;
        Ok(RecipeParts {
            object: object.to_string(),
            head: RecipeObject::decode(object, &bytes)?,
            next: 0,
        })
    }

    pub fn stream_len(&self) -> u64 {
        self.head.stream_len()
    }

    /// The recipe object as read: the whole recipe, or the index, to read
    /// the parts in another order than `next_part`'s.
    pub(crate) fn into_head(self) -> RecipeObject {
        self.head
    }

    /// The next part's object name and recipe, checked against the index:
    /// a missing part is corrupt (the index names it), as is one whose
    /// bytes are not those the index recorded.
    pub fn next_part(&mut self, store: &dyn ObjectStore) -> Option<RepoResult<(String, Recipe)>> {
        let k = self.next;
        self.next += 1;
        match &mut self.head {
            RecipeObject::Whole(r) if k == 0 => Some(Ok((self.object.clone(), std::mem::take(r)))),
            RecipeObject::Whole(_) => None,
            RecipeObject::Index(i) => {
                let info = *i.parts.get(k)?;
                Some(read_part(store, &self.object, k, info))
            }
        }
    }

    /// The stream bytes of the part `next_part` gives next, as the index
    /// (or the whole recipe) says, without reading it: a restore that
    /// cannot read a part still knows which bytes it loses, and one that
    /// wants none of them skips it.
    pub fn next_part_bytes(&self) -> Option<u64> {
        match &self.head {
            RecipeObject::Whole(r) => (self.next == 0).then_some(r.stream_len),
            RecipeObject::Index(i) => i.parts.get(self.next).map(|p| p.bytes),
        }
    }

    /// Pass over the next part without reading it.
    pub fn skip_part(&mut self) {
        self.next += 1;
    }

    /// All the parts' references in one recipe (for a caller that needs
    /// them at once; it holds the whole recipe).
    pub fn read_all(mut self, store: &dyn ObjectStore) -> RepoResult<Recipe> {
        let mut out = Recipe {
            stream_len: self.stream_len(),
            segments: Vec::new(),
        };
        // Grown as the parts are read and checked, not sized by the
        // index's word.
        while let Some(part) = self.next_part(store) {
            let (_, mut part) = part?;
            out.segments.append(&mut part.segments);
        }
        Ok(out)
    }
}

/// Part `k` of recipe `recipe`, which its index describes as `info`.
pub(crate) fn read_part(
    store: &dyn ObjectStore,
    recipe: &str,
    k: usize,
    info: PartInfo,
) -> RepoResult<(String, Recipe)> {
    let name = part_name(recipe, k);
    let bytes = match store.get(&name) {
        Err(Error::NotFound { .. }) => {
            return Err(RepoError::corrupt(
                &name,
                format!("missing, but recipe {recipe} names it"),
            ))
        }
        other => other?,
    };
    let digest = part_digest(&bytes);
    if digest != info.digest {
        return Err(RepoError::corrupt(
            &name,
            format!(
                "not the part recipe {recipe} wrote (its BLAKE3 is {}, the recipe's {})",
                Fingerprint(digest).to_hex(HASH),
                Fingerprint(info.digest).to_hex(HASH)
            ),
        ));
    }
    let part = Recipe::decode(&name, &bytes)?;
    if part.segments.len() as u64 != info.segments || part.stream_len != info.bytes {
        return Err(RepoError::corrupt(
            &name,
            format!(
                "{} segments of {} bytes, but recipe {recipe} names {} of {}",
                part.segments.len(),
                part.stream_len,
                info.segments,
                info.bytes
            ),
        ));
    }
    Ok((name, part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_recipe_names_are_not_parts() {
        let recipe = "recipes/db.p1-00000000deadbeef";
        assert_eq!(part_of(recipe), None);
        assert_eq!(recipe_of(recipe), recipe);
        for k in [0, 1, 0xff, 0xffff_ffff] {
            let p = part_name(recipe, k);
            crate::name::validate(&p).unwrap();
            assert_eq!(part_of(&p), Some((recipe, k)));
            assert_eq!(recipe_of(&p), recipe);
        }
        assert_eq!(part_of("recipes/x-1.p0"), None, "not 8 digits");
        assert_eq!(part_of("recipes/x-1.p0000000g"), None, "not hex");
    }

    #[test]
    fn longest_backup_name_leaves_room_for_part_names() {
        let name = "n".repeat(crate::backup::MAX_BACKUP_NAME);
        let recipe = format!("{}{name}-{:016x}", crate::backup::RECIPES_PREFIX, u64::MAX);
        crate::name::validate(&part_name(&recipe, u32::MAX as usize)).unwrap();
    }
}
