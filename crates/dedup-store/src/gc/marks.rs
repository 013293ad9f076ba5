//! A backup group's mark results (§3.3, "G1, G2…" in the paper's Figure
//! 2): for every container the group's backups reference, the catalog
//! entries they use (a bitmap, and where kept how many of the backups use
//! each), together with the backups (name and recipe object) they were
//! computed from. Recipes are immutable and a backup's
//! recipe name carries a nonce, so marks whose backup set equals the
//! group's current one are still exact and are reused without reading a
//! recipe.
//!
//! Object `gc/marks/<group>-<generation>` (16 hex digits). Marks are
//! derived data, replaced put-new-then-delete-old: a crash between the two
//! leaves both, and readers take the highest generation (the older ones
//! are deleted by the next GC). A damaged marks object is only a cost: the
//! group is marked again.
//!
//! Marks also *count*, per entry, how many of the group's backups
//! reference it, so that a changed group is marked again from the recipes
//! of the backups that changed only: a deleted backup's references are
//! taken out, a new one's added, and an entry is live while its count is
//! above zero (`mark.rs`). Counts are kept only while they fit
//! (`MAX_COUNTED` entries a group, a count below `u16::MAX`); marks
//! without them are exact all the same, and a changed group is then
//! marked again from all its recipes, as before counts.
//!
//! Body after the frame (magic `DDUPMARK`): group (u16 length + UTF-8),
//! backup count b (u64), b × (name, recipe) as u16-length strings,
//! container count c (u64), then, in version 1 (no counts), c × (container
//! id u64, bitmap length n u32, n bytes: bit i of byte i/8 (least
//! significant first) set if entry i is referenced), every bitmap
//! non-empty with its last byte non-zero; in version 2 (counted), c ×
//! (container id u64, entry count n u32, n × u16: how many of the
//! backups reference entry i, at most b), n non-zero and the last count
//! non-zero; version 3 is version 2 with its body compressed (zstd, as
//! `framed::frame_compressed` makes it; counts of versions of one stream
//! are mostly one value). Ids strictly ascending in all.
//!
//! Counts stay exact because a recipe never changes once written and its
//! name carries a nonce: the references taken out for a backup are the
//! ones added for it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, frame_compressed, put_str, unframe_any, unzstd, Reader};
use crate::recipe::Recipe;

const MAGIC: [u8; 8] = *b"DDUPMARK";
const BITMAPS: u32 = 1;
const COUNTED: u32 = 2;
const COUNTED_ZSTD: u32 = 3;
pub const MARKS_PREFIX: &str = "gc/marks/";

/// Entries a group's counts may cover (2 bytes each: 64 MiB while a GC
/// marks it, 128 GiB of distinct 4 KiB segments). A larger group keeps
/// bitmaps only, and is marked again from all its recipes when it changes.
const MAX_COUNTED: usize = 32 << 20;

/// Per container, how many backups reference each entry.
pub type Counts = BTreeMap<u64, Vec<u16>>;

/// One group's marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub group: String,
    /// Backup name → recipe object name: what the marks were computed from.
    pub backups: BTreeMap<String, String>,
    /// Container id → bitmap of referenced catalog entries.
    pub containers: BTreeMap<u64, Vec<u8>>,
    /// How many of `backups` reference each entry, where kept (an entry
    /// is marked exactly when its count is above zero).
    pub counts: Option<Counts>,
}

impl Marks {
    /// Marks that keep bitmaps only: one recipe's, or a union.
    pub fn new(group: &str) -> Marks {
        Marks {
            group: group.to_string(),
            ..Marks::default()
        }
    }

    /// A group's marks, counting from no backup.
    pub fn counted(group: &str) -> Marks {
        Marks {
            counts: Some(Counts::new()),
            ..Marks::new(group)
        }
    }

    /// Add backup `name` (recipe object `recipe`), whose own marks are
    /// `one`. Counts that would no longer fit are dropped.
    pub fn add_backup(&mut self, name: &str, recipe: &str, one: &Marks) {
        self.merge(one);
        self.backups.insert(name.to_string(), recipe.to_string());
        let Some(counts) = self.counts.as_mut() else {
            return;
        };
        let (mut fits, mut grown) = (true, false);
        for (id, bits) in &one.containers {
            let c = counts.entry(*id).or_default();
            for i in set_entries(bits) {
                if c.len() <= i {
                    c.resize(i + 1, 0);
                    grown = true;
                }
                c[i] = c[i].saturating_add(1);
                fits &= c[i] < u16::MAX;
            }
        }
        // Summed only when it grew: versions of one stream mostly count
        // entries already counted.
        if !fits || (grown && counts.values().map(Vec::len).sum::<usize>() > MAX_COUNTED) {
            self.counts = None;
        }
    }

    /// Take backup `name` out, given its own marks `one` (from its
    /// recipe). False, with nothing changed, if the counts cannot say:
    /// none are kept, the backup is not among these marks', or `one`
    /// references an entry no counted backup does. The group must then be
    /// marked again from its recipes.
    pub fn remove_backup(&mut self, name: &str, one: &Marks) -> bool {
        let Some(counts) = self.counts.as_mut() else {
            return false;
        };
        let counted = |id: &u64, i: usize| {
            counts
                .get(id)
                .and_then(|c| c.get(i))
                .is_some_and(|&n| n > 0)
        };
        if !self.backups.contains_key(name)
            || !one
                .containers
                .iter()
                .all(|(id, bits)| set_entries(bits).all(|i| counted(id, i)))
        {
            return false;
        }
        for (id, bits) in &one.containers {
            let c = counts.get_mut(id).expect("checked above");
            set_entries(bits).for_each(|i| c[i] -= 1);
            while c.last() == Some(&0) {
                c.pop();
            }
            if c.is_empty() {
                counts.remove(id);
                self.containers.remove(id);
            } else {
                self.containers.insert(*id, bitmap(c));
            }
        }
        self.backups.remove(name);
        true
    }

    /// Add `other`'s marked entries to these.
    pub fn merge(&mut self, other: &Marks) {
        for (id, bits) in &other.containers {
            let mine = self.containers.entry(*id).or_default();
            if mine.len() < bits.len() {
                mine.resize(bits.len(), 0);
            }
            mine.iter_mut().zip(bits).for_each(|(a, b)| *a |= b);
        }
    }

    /// Mark every segment `recipe` references.
    pub fn mark(&mut self, recipe: &Recipe) {
        for s in &recipe.segments {
            let bits = self.containers.entry(s.container).or_default();
            let byte = s.entry as usize / 8;
            if bits.len() <= byte {
                bits.resize(byte + 1, 0);
            }
            bits[byte] |= 1 << (s.entry % 8);
        }
    }

    pub fn object_name(group: &str, generation: u64) -> String {
        format!("{MARKS_PREFIX}{group}-{generation:016x}")
    }

    /// The group and generation a marks object's name holds.
    pub fn parse_name(object: &str) -> Option<(String, u64)> {
        let (group, generation) = object.strip_prefix(MARKS_PREFIX)?.rsplit_once('-')?;
        if generation.len() != 16 {
            return None;
        }
        let generation = u64::from_str_radix(generation, 16).ok()?;
        Some((group.to_string(), generation))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        put_str(&mut body, &self.group);
        body.extend_from_slice(&(self.backups.len() as u64).to_le_bytes());
        for (name, recipe) in &self.backups {
            put_str(&mut body, name);
            put_str(&mut body, recipe);
        }
        body.extend_from_slice(&(self.containers.len() as u64).to_le_bytes());
        let Some(counts) = &self.counts else {
            for (id, bits) in &self.containers {
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&(bits.len() as u32).to_le_bytes());
                body.extend_from_slice(bits);
            }
            return frame(MAGIC, BITMAPS, &body);
        };
        for (id, c) in counts {
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&(c.len() as u32).to_le_bytes());
            c.iter()
                .for_each(|n| body.extend_from_slice(&n.to_le_bytes()));
        }
        frame_compressed(MAGIC, COUNTED, COUNTED_ZSTD, &body)
    }

    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Marks> {
        let (version, framed) = unframe_any(object, MAGIC, BITMAPS..=COUNTED_ZSTD, bytes)?;
        let body = match version {
            COUNTED_ZSTD => Cow::Owned(unzstd(object, framed)?),
            _ => Cow::Borrowed(framed),
        };
        let corrupt = |d: &str| RepoError::corrupt(object, d);
        let mut r = Reader::new(object, &body);
        let group = r.str()?;
        if Marks::parse_name(object).is_none_or(|(g, _)| g != group) {
            return Err(corrupt("it holds another group's marks"));
        }
        let mut backups = BTreeMap::new();
        for _ in 0..r.u64()? {
            let (name, recipe) = (r.str()?, r.str()?);
            if backups.insert(name, recipe).is_some() {
                return Err(corrupt("a backup is listed twice"));
            }
        }
        let mut containers = BTreeMap::new();
        let mut counts = (version != BITMAPS).then(Counts::new);
        let mut last = None;
        for _ in 0..r.u64()? {
            let id = r.u64()?;
            let n = r.u32()? as usize;
            if last.is_some_and(|l| l >= id) {
                return Err(corrupt("container ids are not ascending"));
            }
            last = Some(id);
            let Some(counts) = counts.as_mut() else {
                let bits = r.bytes(n)?.to_vec();
                if bits.last().is_none_or(|&b| b == 0) {
                    return Err(corrupt("a bitmap is empty or ends in a zero byte"));
                }
                containers.insert(id, bits);
                continue;
            };
            let c: Vec<u16> = r
                .bytes(
                    n.checked_mul(2)
                        .ok_or_else(|| corrupt("too many entries"))?,
                )?
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            if c.last().is_none_or(|&n| n == 0) {
                return Err(corrupt("a container's counts are empty or end in a zero"));
            }
            if c.iter()
                .any(|&n| usize::from(n) > backups.len() || n == u16::MAX)
            {
                return Err(corrupt("a count is above the number of backups"));
            }
            containers.insert(id, bitmap(&c));
            counts.insert(id, c);
        }
        r.finish()?;
        Ok(Marks {
            group,
            backups,
            containers,
            counts,
        })
    }
}

/// The entries set in `bits`.
fn set_entries(bits: &[u8]) -> impl Iterator<Item = usize> + '_ {
    bits.iter().enumerate().flat_map(|(byte, &b)| {
        (0..8)
            .filter(move |k| b & (1 << k) != 0)
            .map(move |k| byte * 8 + k)
    })
}

/// The bitmap of the entries counted above zero (its last byte non-zero
/// when the last count is).
fn bitmap(counts: &[u16]) -> Vec<u8> {
    let mut bits = vec![0u8; counts.len().div_ceil(8)];
    for (i, &n) in counts.iter().enumerate() {
        if n > 0 {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    bits
}

/// Whether entry `i` is set in `bits`.
pub fn is_marked(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::SegmentRef;
    use dedup_common::fingerprint::Fingerprint;

    #[test]
    fn marks_round_trip_and_damage_is_refused() {
        let mut m = Marks::new("g-1");
        m.backups
            .insert("a".into(), "recipes/a-0000000000000001".into());
        let seg = |container, entry| SegmentRef::new(container, entry, 1, &Fingerprint([0; 32]));
        m.mark(&Recipe {
            stream_len: 3,
            segments: vec![seg(5, 0), seg(5, 17), seg(2, 3)],
        });
        assert!(is_marked(&m.containers[&5], 17) && !is_marked(&m.containers[&5], 16));
        let name = Marks::object_name("g-1", 9);
        assert_eq!(Marks::parse_name(&name), Some(("g-1".into(), 9)));
        let bytes = m.encode();
        assert_eq!(Marks::decode(&name, &bytes).unwrap(), m);
        let other = Marks::object_name("g", 9);
        assert!(Marks::decode(&other, &bytes).is_err());
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(Marks::decode(&name, &bad).is_err());
    }

    fn recipe(refs: &[(u64, u32)]) -> Marks {
        let seg = |&(container, entry)| SegmentRef::new(container, entry, 1, &Fingerprint([0; 32]));
        let mut m = Marks::new("g");
        m.mark(&Recipe {
            stream_len: refs.len() as u64,
            segments: refs.iter().map(seg).collect(),
        });
        m
    }

    #[test]
    fn counts_take_a_backup_out_exactly_and_refuse_what_they_cannot_say() {
        let (a, b) = (recipe(&[(5, 0), (5, 9), (2, 3)]), recipe(&[(5, 9), (7, 1)]));
        let mut m = Marks::counted("g");
        m.add_backup("a", "recipes/a-1", &a);
        m.add_backup("b", "recipes/b-2", &b);
        assert_eq!(m.counts.as_ref().unwrap()[&5][9], 2);
        let name = Marks::object_name("g", 1);
        let bytes = m.encode();
        assert_eq!(Marks::decode(&name, &bytes).unwrap(), m);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Marks::decode(&name, &bad).is_err(), "flip at {i}");
        }
        // Not among the marks, or references they do not count: refused,
        // nothing changed.
        let before = m.clone();
        assert!(!m.remove_backup("c", &a));
        assert!(!m.remove_backup("b", &recipe(&[(5, 9), (8, 0)])));
        assert_eq!(m, before);
        // a out: what b alone references, counted once.
        assert!(m.remove_backup("a", &a));
        let mut want = Marks::counted("g");
        want.add_backup("b", "recipes/b-2", &b);
        assert_eq!(m, want);
        assert!(m.remove_backup("b", &b));
        assert_eq!(m, Marks::counted("g"));
        // Without counts (version 1, a union): nothing can be taken out.
        let mut union = Marks::new("g");
        union.add_backup("a", "recipes/a-1", &a);
        let back = Marks::decode(&name, &union.encode()).unwrap();
        assert!(back.counts.is_none() && back == union);
        assert!(!union.remove_backup("a", &a));
    }

    #[test]
    fn counts_that_no_encoder_writes_are_refused() {
        let name = Marks::object_name("g", 1);
        let with = |counts: Vec<u16>| {
            let mut m = Marks::counted("g");
            m.add_backup("a", "recipes/a-1", &recipe(&[(1, 0)]));
            m.counts = Some([(1, counts)].into());
            Marks::decode(&name, &m.encode())
        };
        assert!(with(vec![1]).is_ok());
        for bad in [vec![1, 0], vec![], vec![2], vec![u16::MAX]] {
            assert!(with(bad.clone()).is_err(), "{bad:?}");
        }
        // Versions sharing most entries: stored compressed (version 3),
        // read back.
        let mut m = Marks::counted("g");
        let mut x = 1u64;
        for b in 0..10 {
            let refs: Vec<(u64, u32)> = (0..4096)
                .filter(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    x >> 60 != 0
                })
                .map(|e| (1, e))
                .collect();
            m.add_backup(&format!("b{b}"), &format!("recipes/b{b}-1"), &recipe(&refs));
        }
        let bytes = m.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3);
        assert!(bytes.len() < 2 * 4096 / 2, "{}", bytes.len());
        assert_eq!(Marks::decode(&name, &bytes).unwrap(), m);
    }

    #[test]
    fn a_count_that_would_overflow_drops_the_counts_not_the_marks() {
        let one = recipe(&[(1, 0)]);
        let mut m = Marks::counted("g");
        for i in 0..u16::MAX as usize {
            m.add_backup(&format!("b{i}"), &format!("recipes/b{i}-1"), &one);
        }
        assert!(m.counts.is_none());
        assert!(is_marked(&m.containers[&1], 0));
        assert_eq!(m.backups.len(), u16::MAX as usize);
    }
}
