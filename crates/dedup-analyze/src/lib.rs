//! `dedup analyze`: how much deduplication would save on a dataset, with
//! which chunking, at what cost in metadata and CPU ("Demystifying Data
//! Deduplication", Mandagere et al.): whole-file hashing, fixed-size
//! chunks and content-defined chunks (Rabin, FastCDC) over the same data
//! in one read of it. Fingerprints are the engine's (`dedup_core`).

pub mod algo;
pub mod analysis;
pub mod chunker;
pub mod cpu;
pub mod delta;
pub mod fuzzing;
pub mod index;
pub mod rabin;
pub mod report;
pub mod sample;
#[cfg(test)]
mod testdata;
pub mod walk;

pub use algo::Algorithm;
pub use analysis::{input_len, Analysis, Codec};
pub use report::{report, Report};
pub use walk::{walk, walk_parallel};
