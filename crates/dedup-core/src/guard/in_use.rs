//! Is a file or block device in use by the kernel, so that writing it
//! would destroy something live? A block device is in use when a
//! filesystem on it (or on one of its partitions) is mounted, when
//! another device is stacked on it (`holders`: LVM, RAID, dm-crypt), or
//! when the kernel refuses to open it exclusively (`O_EXCL`: mounted,
//! swap, another exclusive user). A regular file is in use when it backs
//! a loop device that is. `create` (even with `--force`) and a stream
//! restore onto a device ask here; nothing is written under a user.
//!
//! Also: which file a loop device reads (`LOOP_GET_STATUS64`), so one file
//! given for both halves, once by name and once through a loop device, is
//! seen to be one.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What a path stands for on the machine: a file (its device and inode),
/// or a block device (its device number). A loop device stands for the
/// file it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    File { dev: u64, ino: u64 },
    Block { rdev: u64 },
}

/// The identity of `path`, or `None` if it does not exist.
pub fn identity(path: &Path) -> Option<Identity> {
    let m = fs::metadata(path).ok()?;
    if m.file_type().is_block_device() {
        if let Some((dev, ino)) = loop_backing(path, m.rdev()) {
            return Some(Identity::File { dev, ino });
        }
        return Some(Identity::Block { rdev: m.rdev() });
    }
    Some(Identity::File {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Refuse `path` if writing it would destroy something the kernel is
/// using. On success, a block device comes back held open exclusively:
/// keep the handle while writing, and nothing can mount it meanwhile.
pub fn not_in_use(path: &Path) -> Result<Option<File>> {
    let Ok(m) = fs::metadata(path) else {
        return Ok(None);
    };
    if m.file_type().is_block_device() {
        if let Some(why) = block_user(path, m.rdev()) {
            return Err(in_use(path, &why));
        }
        return exclusive(path).map(Some);
    }
    if m.is_file() {
        for (dev, rdev) in loops_backed_by(m.dev(), m.ino()) {
            if let Some(why) = block_user(&dev, rdev) {
                return Err(in_use(
                    path,
                    &format!("it backs the loop device {}, which is {why}", dev.display()),
                ));
            }
        }
    }
    Ok(None)
}

fn in_use(path: &Path, why: &str) -> Error {
    Error::InvalidArgument(format!(
        "{} is in use: {why}. Nothing was written; --force never overwrites a device in use: unmount it (or stop what holds it) first",
        path.display()
    ))
}

/// Open the block device `path` exclusively: the kernel answers EBUSY
/// while it is mounted, a swap area, or claimed by another exclusive user.
fn exclusive(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => in_use(
                path,
                "the kernel refuses to open it exclusively (mounted, a swap area, or claimed by another program)",
            ),
            _ => Error::io(format!("opening {} exclusively", path.display()), e),
        })
}

/// Why the block device `rdev` (at `path`) is in use, if it is: mounted,
/// a partition of it mounted, or another device stacked on it.
fn block_user(path: &Path, rdev: u64) -> Option<String> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let real = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut devs = vec![(rdev, real.clone())];
    devs.extend(partitions(rdev));
    for (dev, name) in &devs {
        if let Some(at) = mounted_at(&mounts, *dev, name) {
            return Some(match *dev == rdev {
                true => format!("mounted at {at}"),
                false => format!("its partition {} is mounted at {at}", name.display()),
            });
        }
        let holders = sysfs(*dev).join("holders");
        let held: Vec<String> = fs::read_dir(&holders)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if !held.is_empty() {
            return Some(format!(
                "{} holds it (LVM, RAID or dm-crypt stacked on it)",
                held.join(", ")
            ));
        }
    }
    None
}

/// The mount point of the first mount in `mountinfo` (the text of
/// /proc/self/mountinfo) whose device is `rdev` or whose source is the
/// device node `name`.
pub(crate) fn mounted_at(mountinfo: &str, rdev: u64, name: &Path) -> Option<String> {
    let want = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let source = line
            .split(" - ")
            .nth(1)
            .and_then(|rest| rest.split(' ').nth(1));
        let by_number = fields.get(2) == Some(&want.as_str());
        let by_name = source.is_some_and(|s| {
            s.starts_with('/') && fs::canonicalize(unescape(s)).is_ok_and(|p| p.as_path() == name)
        });
        (by_number || by_name).then(|| unescape(fields.get(4).copied().unwrap_or("?")))
    })
}

/// Mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn sysfs(rdev: u64) -> PathBuf {
    PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ))
}

/// The partitions of the whole disk `rdev`: (device number, /dev name).
fn partitions(rdev: u64) -> Vec<(u64, PathBuf)> {
    let Ok(dir) = fs::read_dir(sysfs(rdev)) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| {
            let dev = fs::read_to_string(e.path().join("dev")).ok()?;
            let (maj, min) = dev.trim().split_once(':')?;
            let number = libc::makedev(maj.parse().ok()?, min.parse().ok()?);
            Some((number, Path::new("/dev").join(e.file_name())))
        })
        .collect()
}

/// The loop devices that read the file (`dev`, `ino`): (/dev path, device number).
fn loops_backed_by(dev: u64, ino: u64) -> Vec<(PathBuf, u64)> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| e.path().join("loop").exists())
        .filter_map(|e| {
            let node = Path::new("/dev").join(e.file_name());
            let rdev = fs::metadata(&node).ok()?.rdev();
            (loop_backing(&node, rdev) == Some((dev, ino))).then_some((node, rdev))
        })
        .collect()
}

/// The kernel's `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// The (device, inode) of the file the loop device `path` (device number
/// `rdev`) reads, or `None` if it is no loop device or has no file.
fn loop_backing(path: &Path, rdev: u64) -> Option<(u64, u64)> {
    if !sysfs(rdev).join("loop").exists() {
        return None;
    }
    let f = File::open(path).ok()?;
    // SAFETY: all-zero bytes are a valid LoopInfo64 (integers and arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: LOOP_GET_STATUS64 fills a struct loop_info64, which `info`
    // is laid out as, on an open descriptor.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_GET_STATUS64, &mut info) };
    (rc == 0).then_some((info.lo_device, info.lo_inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_found_by_device_number_or_by_source() {
        let info =
            "36 35 7:3 / /mnt/my\\040disk rw,relatime shared:1 - ext4 /dev/nonexistent-x rw\n\
                    40 35 0:52 / /srv rw - btrfs /nonexistent/dev/y rw\n";
        let loop3 = libc::makedev(7, 3);
        assert_eq!(
            mounted_at(info, loop3, Path::new("/dev/loop3")).as_deref(),
            Some("/mnt/my disk")
        );
        assert_eq!(
            mounted_at(info, libc::makedev(7, 4), Path::new("/dev/loop4")),
            None
        );
    }

    #[test]
    fn a_regular_file_is_itself_and_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        fs::write(&a, b"x").unwrap();
        let m = fs::metadata(&a).unwrap();
        assert_eq!(
            identity(&a),
            Some(Identity::File {
                dev: m.dev(),
                ino: m.ino()
            })
        );
        assert!(not_in_use(&a).unwrap().is_none());
        assert_eq!(identity(&dir.path().join("missing")), None);
    }
}
