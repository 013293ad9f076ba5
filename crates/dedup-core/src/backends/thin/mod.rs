//! The `thin` backend after ThinDedup (Ni et al.): window-based
//! persistence with the metadata of a window hidden in LZ4-compressed data
//! blocks of the same window, and fingerprints beside every mapping so
//! data and metadata need no ordering flush.
//!
//! Built in parts; not yet selectable with `dedup create --backend`. Done:
//! the compressed-block format (`cblock`).

pub mod cblock;
