//! The objects of the many-writers protocol (FORMATS.md, "Epochs, pins
//! and id ranges"), each put once with a create-only put and never
//! rewritten:
//!
//! - `gc/epoch-<n>`: collection *n*'s record, what it condemned: the
//!   containers no committed backup and no honoured pin referenced, the
//!   containers it means to compact, and the recipes and trees no backup
//!   names. Creating it is epoch *n* beginning; of two collectors, one
//!   creates it.
//! - `pins/<e>-<writer>-<k>`: a writing process's pin, what its running
//!   backups hold (containers referenced or written, the id range it
//!   hands out from, the recipe and tree objects it is about to commit),
//!   honoured by collections *e* and *e*+1.
//!
//! Both are framed like the repository's other objects (magic, version,
//! body, crc32c) and name their own epoch inside, so a record copied
//! under another name is refused.

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, put_str, unframe, Reader};

pub const EPOCH_PREFIX: &str = "gc/epoch-";
pub const PINS_PREFIX: &str = "pins/";

const EPOCH_MAGIC: [u8; 8] = *b"DDUPEPOC";
const PIN_MAGIC: [u8; 8] = *b"DDUPPIN_";
const VERSION: u32 = 1;

/// What collection `epoch` condemned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochRecord {
    pub epoch: u64,
    /// Containers to delete in the next collection, if still unreferenced.
    pub condemned: Vec<u64>,
    /// Containers to compact in the next collection, if still unpinned,
    /// each with a bitmap of its entries live at this collection's look:
    /// writers refuse the others from now on, and only they are removed.
    pub compact: Vec<(u64, Vec<u8>)>,
    /// Recipes and trees no backup named, to delete in the next
    /// collection if still orphaned.
    pub objects: Vec<String>,
}

/// What a writing process held when it wrote the pin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinRecord {
    pub epoch: u64,
    /// The writing process (`process::tag`): a collection on its machine
    /// ignores the pin once that process is known dead.
    pub process: String,
    /// Containers its running backups reference or wrote.
    pub containers: Vec<u64>,
    /// Id ranges `(start, len)` it hands new containers out from.
    pub ranges: Vec<(u64, u64)>,
    /// Recipe and tree objects it is about to commit (a recipe's name
    /// stands for its parts).
    pub objects: Vec<String>,
}

impl EpochRecord {
    pub fn object_name(epoch: u64) -> String {
        format!("{EPOCH_PREFIX}{epoch:016x}")
    }

    /// The epoch an object name holds, if it is an epoch record's.
    pub fn epoch_of(name: &str) -> Option<u64> {
        let hex = name.strip_prefix(EPOCH_PREFIX)?;
        (hex.len() == 16)
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = self.epoch.to_le_bytes().to_vec();
        put_ids(&mut body, &self.condemned);
        body.extend_from_slice(&(self.compact.len() as u64).to_le_bytes());
        for (id, bits) in &self.compact {
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&(bits.len() as u64).to_le_bytes());
            body.extend_from_slice(bits);
        }
        put_strs(&mut body, &self.objects);
        frame(EPOCH_MAGIC, VERSION, &body)
    }

    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<EpochRecord> {
        let body = unframe(object, EPOCH_MAGIC, VERSION, bytes)?;
        let mut r = Reader::new(object, body);
        let epoch = r.u64()?;
        let condemned = ids(&mut r)?;
        let n = r.u64()?;
        let mut compact = Vec::new();
        for _ in 0..n {
            let id = r.u64()?;
            let len = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
            compact.push((id, r.bytes(len)?.to_vec()));
        }
        let record = EpochRecord {
            epoch,
            condemned,
            compact,
            objects: strs(&mut r)?,
        };
        r.finish()?;
        if Some(record.epoch) != EpochRecord::epoch_of(object) {
            return Err(RepoError::corrupt(
                object,
                format!("it holds the record of epoch {}", record.epoch),
            ));
        }
        Ok(record)
    }
}

impl PinRecord {
    /// The name of `writer`'s `k`th pin, for epoch `epoch`.
    pub fn object_name(epoch: u64, writer: &str, k: u64) -> String {
        format!("{PINS_PREFIX}{epoch:016x}-{writer}-{k:016x}")
    }

    /// The epoch a pin's object name holds.
    pub fn epoch_of(name: &str) -> Option<u64> {
        let rest = name.strip_prefix(PINS_PREFIX)?;
        let hex = rest.get(..16)?;
        (rest.as_bytes().get(16) == Some(&b'-'))
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
    }

    /// The writer a pin's object name holds.
    pub fn writer_of(name: &str) -> Option<&str> {
        PinRecord::epoch_of(name)?;
        let rest = &name[PINS_PREFIX.len() + 17..];
        rest.rsplit_once('-').map(|(writer, _)| writer)
    }

    /// The writer's pin count a pin's object name holds: a later pin of
    /// the same writer has a higher one.
    pub fn count_of(name: &str) -> Option<u64> {
        PinRecord::epoch_of(name)?;
        let rest = &name[PINS_PREFIX.len() + 17..];
        let (_, k) = rest.rsplit_once('-')?;
        u64::from_str_radix(k, 16).ok()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = self.epoch.to_le_bytes().to_vec();
        put_str(&mut body, &self.process);
        put_ids(&mut body, &self.containers);
        body.extend_from_slice(&(self.ranges.len() as u64).to_le_bytes());
        for &(start, len) in &self.ranges {
            body.extend_from_slice(&start.to_le_bytes());
            body.extend_from_slice(&len.to_le_bytes());
        }
        put_strs(&mut body, &self.objects);
        frame(PIN_MAGIC, VERSION, &body)
    }

    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<PinRecord> {
        let body = unframe(object, PIN_MAGIC, VERSION, bytes)?;
        let mut r = Reader::new(object, body);
        let epoch = r.u64()?;
        let process = r.str()?;
        let containers = ids(&mut r)?;
        let n = r.u64()?;
        let mut ranges = Vec::new();
        for _ in 0..n {
            ranges.push((r.u64()?, r.u64()?));
        }
        let objects = strs(&mut r)?;
        r.finish()?;
        if Some(epoch) != PinRecord::epoch_of(object) {
            return Err(RepoError::corrupt(
                object,
                format!("it holds a pin of epoch {epoch}"),
            ));
        }
        Ok(PinRecord {
            epoch,
            process,
            containers,
            ranges,
            objects,
        })
    }

    /// Whether container `id` is one this pin holds, named or in a range.
    pub fn holds(&self, id: u64) -> bool {
        self.containers.contains(&id)
            || self
                .ranges
                .iter()
                .any(|&(start, len)| id >= start && id - start < len)
    }
}

fn put_ids(out: &mut Vec<u8>, ids: &[u64]) {
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

fn put_strs(out: &mut Vec<u8>, strs: &[String]) {
    out.extend_from_slice(&(strs.len() as u64).to_le_bytes());
    for s in strs {
        put_str(out, s);
    }
}

/// A count, then that many ids. Nothing is reserved from the count (a
/// forged one runs out of bytes, not of memory).
fn ids(r: &mut Reader) -> RepoResult<Vec<u64>> {
    let n = r.u64()?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(r.u64()?);
    }
    Ok(out)
}

fn strs(r: &mut Reader) -> RepoResult<Vec<String>> {
    let n = r.u64()?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(r.str()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch() -> EpochRecord {
        EpochRecord {
            epoch: 7,
            condemned: vec![1, 2, 300],
            compact: vec![(9, vec![0b101]), (10, vec![])],
            objects: vec!["recipes/a-00".into(), "trees/b-01".into()],
        }
    }

    fn pin() -> PinRecord {
        PinRecord {
            epoch: 7,
            process: "0123456789abcdef-12-34".into(),
            containers: vec![4, 5],
            ranges: vec![(256, 256)],
            objects: vec!["recipes/a-00".into()],
        }
    }

    #[test]
    fn records_round_trip_under_their_own_names_only() {
        let name = EpochRecord::object_name(7);
        assert_eq!(EpochRecord::epoch_of(&name), Some(7));
        assert_eq!(
            EpochRecord::decode(&name, &epoch().encode()).unwrap(),
            epoch()
        );
        let other = EpochRecord::object_name(8);
        assert!(EpochRecord::decode(&other, &epoch().encode()).is_err());

        let name = PinRecord::object_name(7, "w1", 3);
        assert_eq!(PinRecord::epoch_of(&name), Some(7));
        assert_eq!(PinRecord::writer_of(&name), Some("w1"));
        assert_eq!(PinRecord::decode(&name, &pin().encode()).unwrap(), pin());
        let other = PinRecord::object_name(6, "w1", 3);
        assert!(PinRecord::decode(&other, &pin().encode()).is_err());
        assert!(pin().holds(4) && pin().holds(256) && pin().holds(511));
        assert!(!pin().holds(512) && !pin().holds(6));
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let name = EpochRecord::object_name(7);
        let bytes = epoch().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(EpochRecord::decode(&name, &b).is_err(), "flip at {i}");
            assert!(
                EpochRecord::decode(&name, &bytes[..i]).is_err(),
                "cut at {i}"
            );
        }
        let name = PinRecord::object_name(7, "w", 0);
        let bytes = pin().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(PinRecord::decode(&name, &b).is_err(), "flip at {i}");
            assert!(PinRecord::decode(&name, &bytes[..i]).is_err(), "cut at {i}");
        }
    }

    #[test]
    fn names_that_are_not_records_hold_no_epoch() {
        for bad in ["gc/epoch-7", "gc/epoch-000000000000000g", "gc/marks-1"] {
            assert_eq!(EpochRecord::epoch_of(bad), None, "{bad}");
        }
        for bad in [
            "pins/7-w-0",
            "pins/000000000000000g-w-0",
            "pins/0000000000000007",
        ] {
            assert_eq!(PinRecord::epoch_of(bad), None, "{bad}");
        }
    }
}
