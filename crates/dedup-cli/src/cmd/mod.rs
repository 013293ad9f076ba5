//! The subcommands, one file each, and what they share.

pub mod access;
pub mod analyze;
mod analyze_plot;
pub mod backup;
mod backup_files;
mod backup_remote;
pub mod bench;
pub mod bench_thin;
pub mod check;
pub mod create;
pub mod delete;
pub mod gc;
mod gc_repo;
pub mod grow;
pub mod list;
pub mod nbdkit;
pub mod replay;
pub mod restore;
mod restore_files;
mod restore_target;
pub mod serve;
pub mod status;
pub mod store;
mod store_check;
mod store_remote;
mod store_serve;
pub mod tls;
pub mod trace;
mod write_behind;

use std::path::{Path, PathBuf};

use dedup_core::control::{self, Request};
use dedup_core::layout::{self, DevicePaths, CONTROL_SOCKET_NAME};
use dedup_core::{Device, OpenOptions};

/// Exit code for "could not do it" (check uses 1 for "problems found").
pub const EXIT_FAILURE: u8 = 2;

/// clap value parser for sizes with K/M/G/T suffixes.
pub fn size_arg(s: &str) -> Result<u64, String> {
    dedup_core::size::parse_size(s).map_err(|e| e.to_string())
}

/// The smallest `--index-memory` the commands take: below it the index
/// holds next to nothing, and a bare number (bytes) is likely a slip.
const MIN_INDEX_MEMORY_ARG: u64 = 64 << 10;

pub fn index_memory_arg(s: &str) -> Result<u64, String> {
    let n = size_arg(s)?;
    if n < MIN_INDEX_MEMORY_ARG {
        return Err(format!(
            "{n} bytes is too small for the hash index: give at least {} KiB, e.g. 256M",
            MIN_INDEX_MEMORY_ARG >> 10
        ));
    }
    Ok(n)
}

pub fn control_path(dir: &Path) -> PathBuf {
    dir.join(CONTROL_SOCKET_NAME)
}

/// A device reached either through its serving process or opened here.
pub enum Reached {
    Served(serde_json::Value),
    Offline(Box<Device>),
}

/// Ask the serving process (if any) to do `req`; otherwise open the device
/// here with `opts` (writable ones may change metadata: gc).
pub fn reach(dir: &Path, req: &Request, opts: &OpenOptions) -> anyhow::Result<Reached> {
    let paths = DevicePaths::from_dir(dir)?;
    if let Some(reply) = control::request(&control_path(dir), req)? {
        return Ok(Reached::Served(reply));
    }
    Ok(Reached::Offline(Box::new(layout::open(&paths, opts)?)))
}

pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
