//! A backup group's mark results (§3.3, "G1, G2…" in the paper's Figure
//! 2): for every container the group's backups reference, a bitmap of the
//! catalog entries they use, together with the backups (name and recipe
//! object) it was computed from. Recipes are immutable and a backup's
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
//! Body after the frame (magic `DDUPMARK`, version 1): group (u16 length +
//! UTF-8), backup count b (u64), b × (name, recipe) as u16-length strings,
//! container count c (u64), then c × (container id u64, bitmap length n
//! u32, n bytes: bit i of byte i/8 (least significant first) set if entry
//! i is referenced), ids strictly ascending, every bitmap non-empty with
//! its last byte non-zero.

use std::collections::BTreeMap;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, put_str, unframe, Reader};
use crate::recipe::Recipe;

const MAGIC: [u8; 8] = *b"DDUPMARK";
const VERSION: u32 = 1;
pub const MARKS_PREFIX: &str = "gc/marks/";

/// One group's marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub group: String,
    /// Backup name → recipe object name: what the marks were computed from.
    pub backups: BTreeMap<String, String>,
    /// Container id → bitmap of referenced catalog entries.
    pub containers: BTreeMap<u64, Vec<u8>>,
}

impl Marks {
    pub fn new(group: &str) -> Marks {
        Marks {
            group: group.to_string(),
            ..Marks::default()
        }
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
        for (id, bits) in &self.containers {
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&(bits.len() as u32).to_le_bytes());
            body.extend_from_slice(bits);
        }
        frame(MAGIC, VERSION, &body)
    }

    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Marks> {
        let body = unframe(object, MAGIC, VERSION, bytes)?;
        let corrupt = |d: &str| RepoError::corrupt(object, d);
        let mut r = Reader::new(object, body);
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
        let mut last = None;
        for _ in 0..r.u64()? {
            let id = r.u64()?;
            let n = r.u32()? as usize;
            let bits = r.bytes(n)?.to_vec();
            if last.is_some_and(|l| l >= id) {
                return Err(corrupt("container ids are not ascending"));
            }
            if bits.last().is_none_or(|&b| b == 0) {
                return Err(corrupt("a bitmap is empty or ends in a zero byte"));
            }
            last = Some(id);
            containers.insert(id, bits);
        }
        r.finish()?;
        Ok(Marks {
            group,
            backups,
            containers,
        })
    }
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
}
