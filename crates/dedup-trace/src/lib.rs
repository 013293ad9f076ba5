//! Block traces: what a workload did to a device, without its data.
//!
//! A trace is a sequence of [`Request`]s. Written content is not stored;
//! each written block carries a seed (a fingerprint of the original bytes)
//! and [`content::fill`] turns equal seeds into equal bytes, so a replay
//! deduplicates exactly as the original workload did (Dmdedup §4.2.2: FIU
//! traces replayed with content generated from their hashes).
//!
//! Two input formats: the FIU/SNIA IOTTA lines the paper used
//! ([`fiu`]) and dedup's own ([`native`]), which `dedup serve --record`
//! writes and `dedup trace gen` produces. [`reader::TraceReader`] tells
//! them apart by the first line.

pub mod content;
pub mod fiu;
pub mod fuzzing;
pub mod gen;
pub mod native;
pub mod reader;
pub mod replay;
pub mod request;
pub mod stats;
pub mod workload;

pub use reader::{ParseError, TraceReader};
pub use request::{Content, Op, Request, Seed, BLOCK};
