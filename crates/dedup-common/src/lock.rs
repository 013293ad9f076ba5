//! One server per device: an exclusive `flock` on the metadata device (and
//! the data device), held for as long as the device is open. A second
//! opener gets `Error::Locked`; so does `create` over a device in use.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub struct DeviceLock {
    _files: Vec<File>,
}

impl DeviceLock {
    /// Lock one more file under the same lock.
    pub fn and(mut self, path: &Path) -> Result<DeviceLock> {
        let mut more = DeviceLock::acquire(path)?;
        self._files.append(&mut more._files);
        Ok(self)
    }

    pub fn acquire(meta_path: &Path) -> Result<DeviceLock> {
        let file = File::open(meta_path)
            .map_err(|e| Error::io(format!("opening {} to lock it", meta_path.display()), e))?;
        // SAFETY: flock on a valid, owned descriptor has no memory effects.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(Error::Locked {
                    path: PathBuf::from(meta_path),
                });
            }
            return Err(Error::io(format!("locking {}", meta_path.display()), err));
        }
        Ok(DeviceLock { _files: vec![file] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("meta");
        std::fs::write(&p, b"x").unwrap();
        let first = DeviceLock::acquire(&p).unwrap();
        let err = DeviceLock::acquire(&p)
            .err()
            .expect("second lock must fail");
        assert!(matches!(err, Error::Locked { .. }));
        assert!(err.to_string().contains("in use"));
        drop(first);
        DeviceLock::acquire(&p).unwrap();
    }
}
