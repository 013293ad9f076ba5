//! The narrow interface a key-value engine must offer to become a dedup
//! backend through `KvBackend`: point reads, ordered scans, and one atomic,
//! durable `apply` of a transaction's changes. cowbtree (redb) and lsm
//! (fjall) implement it.

use std::collections::BTreeMap;

use crate::backend::MetaIoStats;
use crate::codec::{Decoder, Encoder};
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// Everything a transaction changed; `None` / 0 mean "delete".
#[derive(Default)]
pub struct Changes {
    pub lbn_map: BTreeMap<Lbn, Option<Pbn>>,
    pub hash_index: BTreeMap<Fingerprint, Option<Pbn>>,
    pub refcounts: BTreeMap<Pbn, u32>,
}

impl Changes {
    pub fn len(&self) -> usize {
        self.lbn_map.len() + self.hash_index.len() + self.refcounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.lbn_map.clear();
        self.hash_index.clear();
        self.refcounts.clear();
    }
}

/// Totals and cursors stored with every commit, atomically with the changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreState {
    pub lbns_mapped: u64,
    pub pbns_used: u64,
    pub hash_entries: u64,
    pub alloc_cursor: u64,
    pub counters: Vec<u64>,
}

const STATE_VERSION: u32 = 1;

impl StoreState {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u32(STATE_VERSION)
            .u64(self.lbns_mapped)
            .u64(self.pbns_used)
            .u64(self.hash_entries)
            .u64(self.alloc_cursor)
            .u32(self.counters.len() as u32);
        for c in &self.counters {
            e.u64(*c);
        }
        let crc = crc32c::crc32c(&e.buf);
        e.u32(crc);
        e.buf
    }

    pub fn decode(bytes: &[u8], structure: &str) -> Result<StoreState> {
        use crate::error::Error;
        if bytes.len() < 4 || !crate::codec::is_sealed(bytes) {
            return Err(Error::corrupt(structure, "state record checksum mismatch"));
        }
        let mut d = Decoder::new(&bytes[..bytes.len() - 4], structure);
        let version = d.u32()?;
        if version != STATE_VERSION {
            return Err(Error::corrupt(
                structure,
                format!("unknown state version {version}"),
            ));
        }
        let mut s = StoreState {
            lbns_mapped: d.u64()?,
            pbns_used: d.u64()?,
            hash_entries: d.u64()?,
            alloc_cursor: d.u64()?,
            counters: Vec::new(),
        };
        let n = d.u32()?;
        if n > 1024 {
            return Err(Error::corrupt(
                structure,
                format!("{n} counters is not plausible"),
            ));
        }
        for _ in 0..n {
            s.counters.push(d.u64()?);
        }
        Ok(s)
    }
}

pub trait KvStore: Send {
    fn get_lbn(&mut self, lbn: Lbn) -> Result<Option<Pbn>>;
    fn get_hash(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>>;
    /// 0 when absent.
    fn get_refcount(&mut self, pbn: Pbn) -> Result<u32>;
    /// Up to `max` entries with keys greater than `after`, ascending.
    fn scan_lbn(&mut self, after: Option<Lbn>, max: usize, out: &mut Vec<(Lbn, Pbn)>)
        -> Result<()>;
    fn scan_hash(
        &mut self,
        after: Option<&Fingerprint>,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<()>;
    /// Every stored non-zero count, at open.
    fn for_each_refcount(&mut self, f: &mut dyn FnMut(Pbn, u32) -> Result<()>) -> Result<()>;
    /// The state stored by the last `apply` (default when none yet).
    fn state(&mut self) -> Result<StoreState>;
    /// Apply `changes` and `state` atomically and durably: after a crash the
    /// store holds all of them or none.
    fn apply(&mut self, changes: &Changes, state: &StoreState) -> Result<()>;
    fn close(&mut self) -> Result<()>;
    fn io_stats(&self) -> MetaIoStats;
    /// Bytes the store occupies.
    fn size_bytes(&self) -> u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_detects_damage() {
        let s = StoreState {
            lbns_mapped: 5,
            pbns_used: 3,
            hash_entries: 4,
            alloc_cursor: 9,
            counters: vec![1, 2, 3],
        };
        let mut bytes = s.encode();
        assert_eq!(StoreState::decode(&bytes, "t").unwrap(), s);
        bytes[5] ^= 1;
        assert!(StoreState::decode(&bytes, "t").is_err());
        assert!(StoreState::decode(&[], "t").is_err());
    }
}

/// Which table an entry belongs to, mixed into its checksum.
#[derive(Clone, Copy)]
pub enum Table {
    LbnMap = 1,
    HashIndex = 2,
    Refcounts = 3,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::LbnMap => "LBN map",
            Table::HashIndex => "hash index",
            Table::Refcounts => "refcounts",
        }
    }
}

/// Every entry a key-value engine stores carries a crc32c of its table, key
/// and value: the engines check their own pages and blocks against torn or
/// damaged writes, but a flipped bit inside a B-tree page could otherwise
/// move a mapping to another LBN and still look consistent.
pub fn entry_crc(table: Table, key: &[u8], value: u64) -> u32 {
    let mut c = crc32c::crc32c(&[table as u8]);
    c = crc32c::crc32c_append(c, key);
    crc32c::crc32c_append(c, &value.to_le_bytes())
}

/// Check a stored entry's crc32c; a mismatch names the table and key.
pub fn check_entry(engine: &str, table: Table, key: &[u8], value: u64, crc: u32) -> Result<u64> {
    if entry_crc(table, key, value) == crc {
        Ok(value)
    } else {
        Err(crate::error::Error::corrupt(
            format!("{engine} {}", table.name()),
            format!(
                "the entry for key {} fails its checksum; {}",
                hex(key),
                crate::backends::NOT_REBUILT
            ),
        ))
    }
}

fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}
