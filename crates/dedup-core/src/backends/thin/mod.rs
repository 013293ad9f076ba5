//! The `thin` backend after ThinDedup (Ni et al.): window-based
//! persistence with the metadata of a window hidden in LZ4-compressed data
//! blocks of the same window, and fingerprints beside every mapping so
//! data and metadata need no ordering flush.
//!
//! `backend` puts the parts together (with the `ordered` and `ideal`
//! policies for comparison); it passes the model and power-cut suites and
//! is not yet offered by `dedup create`. The parts:
//! the compressed-block format (`cblock`) and the packing of a window's
//! metadata into its blocks, with metadata blocks for what does not fit
//! (`window`); zones with their status, free bitmaps and clean/dirty flags
//! (`zones`); recovery by fingerprints, applying the entries written since
//! the last commit on top of it (`replay`).

pub mod backend;
pub mod cblock;
pub mod replay;
pub mod window;
pub mod zones;
