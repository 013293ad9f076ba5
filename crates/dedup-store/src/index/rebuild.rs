//! Rebuilding the index from the containers' catalogs. The catalogs are
//! the truth; the index is only a sampled summary of them, so after a crash
//! without a usable checkpoint it is rebuilt by reading every catalog (two
//! ranged reads each, never the segments) and inserting it in id order,
//! which is the order the containers were sealed in.

use crate::container::{container_name, Catalog};
use crate::error::{Error, Result};
use crate::format::Entry;
use crate::objects::ObjectStore;

use super::{Index, IndexConfig};

const PREFIX: &str = "containers/";

/// The ids of every container in `store`, ascending.
pub fn container_ids(store: &dyn ObjectStore) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for name in store.list(PREFIX)? {
        let id = name
            .strip_prefix(PREFIX)
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .filter(|&id| container_name(id) == name)
            .ok_or_else(|| {
                Error::corrupt(&name, "not a container name (16 lower-case hex digits)")
            })?;
        ids.push(id);
    }
    ids.sort_unstable();
    Ok(ids)
}

/// A prefetch loader reading catalogs from `store`, for [`Index::lookup`].
pub fn catalog_loader(store: &dyn ObjectStore) -> impl Fn(u64) -> Result<Vec<Entry>> + '_ {
    move |id| Ok(Catalog::read(store, id)?.entries().to_vec())
}

impl Index {
    /// An index of every container in `store`.
    pub fn rebuild(store: &dyn ObjectStore, config: IndexConfig) -> Result<Index> {
        let mut index = Index::new(config);
        for id in container_ids(store)? {
            let catalog = Catalog::read(store, id)?;
            let fps: Vec<_> = catalog
                .entries()
                .iter()
                .filter(|e| !e.is_absent())
                .map(|e| e.fingerprint)
                .collect();
            index.insert(id, &fps);
        }
        Ok(index)
    }
}
