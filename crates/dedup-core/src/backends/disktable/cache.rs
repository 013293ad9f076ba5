//! disktable's buffer cache (Dmdedup §2.6.2, dm-bufio): table blocks in
//! 4 KiB units, a configurable capacity, least-recently-used eviction of
//! clean blocks. Dirty blocks are never evicted: they leave the cache only
//! through a journaled commit, which the backend asks for when 75 % of the
//! cache is dirty (the paper's write-back threshold).

use std::sync::Arc;

use lru::LruCache;
use rustc_hash::FxHashMap;

use super::geometry::{block_ok, seal_block, Area, BLOCK, ROOT};
use crate::backend::MetaIoStats;
use crate::blockfile::BlockFile;
use crate::error::Result;

pub type Block = Box<[u8; BLOCK]>;

pub struct Cache {
    file: Arc<dyn BlockFile>,
    geo: Area,
    capacity: usize,
    clean: LruCache<u64, Block>,
    dirty: FxHashMap<u64, Block>,
    pub io: MetaIoStats,
    /// Opened for check (`salvage`): a block other than the root that
    /// fails its checksum reads as empty instead of failing, and is noted
    /// in `lost`.
    salvage: bool,
    /// Blocks read as empty because they failed their checksum, in the
    /// order found, until the commit that rewrites them (they stay dirty).
    pub lost: Vec<u64>,
}

fn new_block() -> Block {
    Box::new([0u8; BLOCK])
}

impl Cache {
    pub fn new(file: Arc<dyn BlockFile>, geo: Area, capacity_bytes: u64) -> Cache {
        Cache {
            file,
            geo,
            capacity: ((capacity_bytes / BLOCK as u64) as usize).max(64),
            clean: LruCache::unbounded(),
            dirty: FxHashMap::default(),
            io: MetaIoStats::default(),
            salvage: false,
            lost: Vec::new(),
        }
    }

    /// From now on, read a damaged block as empty (see `lost`).
    pub fn salvage(&mut self) {
        self.salvage = true;
    }

    /// Take `block_no` as lost: empty from now on, and rewritten by the
    /// next commit (a store that read and checked it itself).
    pub fn mark_lost(&mut self, block_no: u64) {
        self.clean.pop(&block_no);
        self.dirty.insert(block_no, new_block());
        if !self.lost.contains(&block_no) {
            self.lost.push(block_no);
        }
    }

    pub fn capacity_blocks(&self) -> usize {
        self.capacity
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Read a table block from the metadata device, checking it. `None`:
    /// it failed its checksum while salvaging, and is now lost.
    fn read_home(&mut self, block_no: u64) -> Result<Option<Block>> {
        let mut b = new_block();
        let at = self.geo.table_start + block_no * BLOCK as u64;
        self.file.read_at(&mut b[..], at)?;
        self.io.reads += 1;
        self.io.bytes_read += BLOCK as u64;
        if block_ok(block_no, &b[..]) {
            return Ok(Some(b));
        }
        if !self.salvage || block_no == ROOT {
            return Err(self.geo.damaged(block_no));
        }
        tracing::warn!(
            "{}: block {block_no} fails its checksum; reading it as empty for the check",
            self.geo.table_name(block_no)
        );
        self.mark_lost(block_no);
        Ok(None)
    }

    /// Evict least recently used clean blocks until `room` more blocks fit.
    /// Dirty blocks are never evicted: with the cache full of them it grows
    /// past its capacity until the commit the backend is asking for.
    fn evict(&mut self, room: usize) {
        while self.clean.len() + self.dirty.len() + room > self.capacity {
            if self.clean.pop_lru().is_none() {
                break;
            }
        }
    }

    /// A block to read.
    pub fn get(&mut self, block_no: u64) -> Result<&[u8; BLOCK]> {
        if self.dirty.contains_key(&block_no) {
            self.io.cache_hits += 1;
            return Ok(self.dirty.get(&block_no).expect("checked"));
        }
        if self.clean.contains(&block_no) {
            self.io.cache_hits += 1;
            return Ok(self.clean.get(&block_no).expect("checked"));
        }
        self.io.cache_misses += 1;
        let Some(b) = self.read_home(block_no)? else {
            return Ok(self.dirty.get(&block_no).expect("marked lost"));
        };
        self.evict(1);
        self.clean.put(block_no, b);
        Ok(self.clean.get(&block_no).expect("just inserted"))
    }

    /// A block to change; it stays in the cache until the next commit.
    pub fn get_mut(&mut self, block_no: u64) -> Result<&mut [u8; BLOCK]> {
        if !self.dirty.contains_key(&block_no) {
            let b = match self.clean.pop(&block_no) {
                Some(b) => {
                    self.io.cache_hits += 1;
                    b
                }
                None => {
                    self.io.cache_misses += 1;
                    match self.read_home(block_no)? {
                        Some(b) => b,
                        None => new_block(), // lost: empty
                    }
                }
            };
            self.evict(1);
            self.dirty.insert(block_no, b);
        } else {
            self.io.cache_hits += 1;
        }
        Ok(self.dirty.get_mut(&block_no).expect("inserted above"))
    }

    /// The dirty blocks, sealed, in block order (for a commit).
    pub fn sealed_dirty(&mut self) -> Vec<(u64, Block)> {
        let mut out: Vec<(u64, Block)> = self
            .dirty
            .iter()
            .map(|(&n, b)| {
                let mut copy = b.clone();
                seal_block(n, &mut copy[..]);
                (n, copy)
            })
            .collect();
        out.sort_unstable_by_key(|(n, _)| *n);
        out
    }

    /// The commit is durable: dirty blocks become clean cached blocks. Lost
    /// blocks were among them, rewritten whole: no longer damaged.
    pub fn mark_clean(&mut self) {
        self.lost.clear();
        for (n, b) in std::mem::take(&mut self.dirty) {
            self.clean.put(n, b);
        }
        self.evict(0);
    }
}
