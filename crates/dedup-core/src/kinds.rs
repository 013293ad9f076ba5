//! The table of what users can pick with `dedup create --backend`: for each
//! name, its metadata store, its data placement and whether it survives a
//! crash. The only place a backend's name is matched. A plain table with no
//! imports: the configuration (`DeviceConfig::placement`) and the registry
//! both read it, so it sits below them.

/// Which metadata store keeps a device's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    InRam,
    DiskTable,
    CowBtree,
    Lsm,
    Sparse,
}

/// Where a device's chunks live on the data device. `Plain` becomes
/// `Packed` when the device compresses (see `DeviceConfig::placement`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementKind {
    Plain,
    Packed,
    Thin,
}

/// thin's window policies (ThinDedup and its two comparisons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinPolicy {
    Thin,
    Ordered,
    Ideal,
}

#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub name: &'static str,
    pub store: StoreKind,
    /// `Plain` here means plain or packed, by the device's compression.
    pub placement: PlacementKind,
    pub policy: Option<ThinPolicy>,
    /// Survives kill -9 and power loss without `--accept-unclean`.
    pub crash_safe: bool,
    /// One line for `--help` and errors.
    pub about: &'static str,
}

pub const KINDS: &[Kind] = &[
    Kind {
        name: "sparse",
        store: StoreKind::Sparse,
        placement: PlacementKind::Plain,
        policy: None,
        crash_safe: true,
        about: "metadata that grows with the data: paged tables in a sparse file, a redo journal, a sampled hash index in RAM",
    },
    Kind {
        name: "inram",
        store: StoreKind::InRam,
        placement: PlacementKind::Plain,
        policy: None,
        crash_safe: false,
        about: "all metadata in RAM, saved at a clean stop (Dmdedup INRAM)",
    },
    Kind {
        name: "disktable",
        store: StoreKind::DiskTable,
        placement: PlacementKind::Plain,
        policy: None,
        crash_safe: true,
        about: "tables on the metadata device behind a cache, with a redo journal (Dmdedup DTB)",
    },
    Kind {
        name: "cowbtree",
        store: StoreKind::CowBtree,
        placement: PlacementKind::Plain,
        policy: None,
        crash_safe: true,
        about: "copy-on-write B-trees (redb) (Dmdedup CBT)",
    },
    Kind {
        name: "lsm",
        store: StoreKind::Lsm,
        placement: PlacementKind::Plain,
        policy: None,
        crash_safe: true,
        about: "an LSM tree (fjall) beside the metadata device",
    },
    Kind {
        name: "thin",
        store: StoreKind::DiskTable,
        placement: PlacementKind::Thin,
        policy: Some(ThinPolicy::Thin),
        crash_safe: true,
        about: "ThinDedup: window metadata hidden in LZ4-compressed data blocks",
    },
    Kind {
        name: "ordered",
        store: StoreKind::DiskTable,
        placement: PlacementKind::Thin,
        policy: Some(ThinPolicy::Ordered),
        crash_safe: true,
        about: "ThinDedup's OrderedWrites comparison: data, flush, metadata, flush",
    },
    Kind {
        name: "ideal",
        store: StoreKind::DiskTable,
        placement: PlacementKind::Thin,
        policy: Some(ThinPolicy::Ideal),
        crash_safe: false,
        about: "ThinDedup's upper bound: window metadata in RAM only (not crash-safe)",
    },
];

/// The kind of this name, if there is one.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}
