//! Reaching a device: through its serving process's control socket when
//! it is served, or opened here when it is not (status, check, gc).

use std::path::{Path, PathBuf};

use dedup_core::control::{self, Request};
use dedup_core::layout::{self, DevicePaths, CONTROL_SOCKET_NAME};
use dedup_core::{Device, OpenOptions};

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
