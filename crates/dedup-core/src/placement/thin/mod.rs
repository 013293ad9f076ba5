//! The `thin` placement after ThinDedup (Ni et al.): window-based
//! persistence with the metadata of a window hidden in LZ4-compressed data
//! blocks of the same window, and fingerprints beside every mapping so
//! data and metadata need no ordering flush.
//!
//! `placement` is the `Placement` (with the `ordered` and `ideal` policies
//! for comparison) over the disktable store's tables: placement, staging,
//! entries. Its parts: the compressed-block format (`cblock`); packing a
//! window's entries into its blocks, with metadata blocks for what does not
//! fit (`window`); zones with their status, bitmaps and clean/dirty flags
//! (`zones`); closing windows and committing the tables (`persist`);
//! recovery by fingerprints (`replay`, driven by `recover`).

pub mod cblock;
mod persist;
pub mod placement;
mod recover;
pub mod replay;
pub mod window;
pub mod zones;
