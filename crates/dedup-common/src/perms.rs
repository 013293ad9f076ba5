//! Owner-only files, directories and sockets. A device's data and
//! metadata files hold everything its clients ever wrote, and its sockets
//! give full read-write access to it, so whatever dedup creates for a
//! device is for the user who runs dedup alone: files 0600, directories
//! 0700, sockets 0600, whatever the umask of the process that creates them.
//!
//! Each mode is given at creation, so there is no moment at which the
//! thing is wider (the umask can only take bits away from it), and then set
//! once more explicitly, so that a strict umask (say 0277) cannot leave a
//! file the owner cannot write either.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Files: read and write for the owner only.
pub const FILE_MODE: u32 = 0o600;
/// Directories: the owner only.
pub const DIR_MODE: u32 = 0o700;
/// Sockets: connecting needs write permission, so this is owner-only.
pub const SOCKET_MODE: u32 = 0o600;

/// Options that create a file owner-only (add `write`, `create_new`, ...).
/// Follow the open with [`set_file_mode`].
pub fn file_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Give a file this module's mode exactly, umask or not.
pub fn set_file_mode(file: &File) -> io::Result<()> {
    file.set_permissions(Permissions::from_mode(FILE_MODE))
}

/// Create the directory `dir` owner-only; its missing parents are created
/// as any directory is (they are not the device's).
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    DirBuilder::new().mode(DIR_MODE).create(dir)?;
    fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
}

/// Make a directory that other code filled (fjall's tables) owner-only:
/// the directory and those below it 0700, every file 0600. Symlinks are
/// left alone (their targets are not ours to change).
pub fn restrict_tree(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            restrict_tree(&entry.path())?;
        } else if kind.is_file() {
            fs::set_permissions(entry.path(), Permissions::from_mode(FILE_MODE))?;
        }
    }
    Ok(())
}

/// Listen on a Unix socket at `path` that is owner-only from the moment it
/// exists: the mode is set on the socket before `bind` creates its file
/// (Linux creates it with the socket's mode less the umask), then again on
/// the file. std's `UnixListener::bind` would create it 0777 less the
/// umask, connectable by every local user until a chmod.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the socket path is longer than {} bytes (or holds a NUL): use a shorter path",
                addr.sun_path.len() - 1
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(sock.as_raw_fd(), SOCKET_MODE as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr is a valid, NUL-terminated sockaddr_un of `len` bytes.
    let bound = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len,
        )
    };
    if bound != 0 {
        return Err(io::Error::last_os_error());
    }
    fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE))?;
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(sock.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixListener::from(sock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_created_directory_is_owner_only_and_an_existing_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("parent/dev");
        create_dir_all(&dir).unwrap();
        assert!(tmp.path().join("parent").is_dir());
        assert_eq!(mode(&dir), DIR_MODE);
        assert!(
            create_dir_all(&dir).is_err(),
            "an existing directory is not taken over"
        );
    }

    #[test]
    fn restrict_tree_narrows_files_and_directories_below() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("t");
        fs::create_dir_all(top.join("sub")).unwrap();
        fs::write(top.join("sub/f"), b"x").unwrap();
        fs::set_permissions(top.join("sub/f"), Permissions::from_mode(0o666)).unwrap();
        fs::set_permissions(top.join("sub"), Permissions::from_mode(0o777)).unwrap();
        restrict_tree(&top).unwrap();
        assert_eq!(mode(&top), DIR_MODE);
        assert_eq!(mode(&top.join("sub")), DIR_MODE);
        assert_eq!(mode(&top.join("sub/f")), FILE_MODE);
    }

    #[test]
    fn a_bound_socket_is_owner_only_and_answers() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let listener = bind_socket(&path).unwrap();
        assert_eq!(mode(&path), SOCKET_MODE);
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        let long = tmp.path().join("x".repeat(200));
        let err = bind_socket(&long).unwrap_err();
        assert!(err.to_string().contains("shorter path"), "{err}");
    }
}
