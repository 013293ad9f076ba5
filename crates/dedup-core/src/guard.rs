//! What `create` must not overwrite without `--force`: a file or block
//! device that already holds something (another dedup device, a
//! filesystem, a partition table, any data), and, never, even with
//! `--force`: a device being served, one mounted or otherwise in use
//! (`in_use.rs`), or one file given as both halves (by two names, or once
//! through a loop device that reads it).

mod in_use;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

pub use in_use::{identity, not_in_use, Identity};

use crate::blockfile::{BlockFile, FileBlockFile};
use crate::error::{Error, Result};
use crate::superblock::{DATA_MAGIC, META_MAGIC, SUPERBLOCK_SIZE};

/// How much of an existing file or device is read to tell whether it is
/// empty: every common signature (partition tables, ext4, XFS, btrfs at
/// 64 KiB, swap, LUKS, LVM) lies in it.
const HEAD: u64 = 1 << 20;

/// Known signatures: (offset, bytes, what it is).
const SIGNATURES: &[(u64, &[u8], &str)] = &[
    (1080, &[0x53, 0xef], "an ext2/3/4 filesystem"),
    (0, b"XFSB", "an XFS filesystem"),
    (65600, b"_BHRfS_M", "a btrfs filesystem"),
    (4086, b"SWAPSPACE2", "a swap area"),
    (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    (512, b"LABELONE", "an LVM physical volume"),
    (512, b"EFI PART", "a GPT partition table"),
    (510, &[0x55, 0xaa], "a partition table or boot sector"),
];

/// What an existing file or block device holds, in words, or `None` if it
/// reads as zeros for its first MiB (a new sparse file, a wiped disk).
pub fn contents(f: &FileBlockFile) -> Result<Option<String>> {
    let len = f.len()?;
    let mut head = vec![0u8; len.min(HEAD) as usize];
    f.read_at(&mut head, 0)?;
    for at in [0, SUPERBLOCK_SIZE] {
        if head.get(at..at + 8) == Some(META_MAGIC) {
            return Ok(Some("a dedup metadata device".into()));
        }
    }
    if head.get(..8) == Some(DATA_MAGIC) {
        return Ok(Some("a dedup data device".into()));
    }
    if head.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let found = SIGNATURES.iter().find(|(at, magic, _)| {
        let at = *at as usize;
        head.get(at..at + magic.len()) == Some(magic)
    });
    Ok(Some(match found {
        Some((_, _, what)) => (*what).to_string(),
        None => "data (its first MiB is not all zeros)".to_string(),
    }))
}

/// Refuse one file given for both data and metadata: by another name, or
/// through a loop device that reads it (`--data x.img --meta /dev/loop0`
/// with loop0 on x.img; writing one half would overwrite the other).
pub fn distinct(data: &Path, meta: &Path) -> Result<()> {
    let same = match (identity(data), identity(meta)) {
        (Some(d), Some(m)) => d == m,
        _ => std::path::absolute(data).ok() == std::path::absolute(meta).ok(),
    };
    if same {
        let is_loop = |p: &Path| {
            std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
                && matches!(identity(p), Some(Identity::File { .. }))
        };
        let how = match [data, meta].into_iter().find(|p| is_loop(p)) {
            Some(l) => format!(", {} being a loop device that reads it", l.display()),
            None => String::new(),
        };
        return Err(Error::InvalidArgument(format!(
            "--data {} and --meta {} are the same file{how}: a device needs two, one for chunks and one for metadata",
            data.display(),
            meta.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[(u64, &[u8])], len: u64) -> (tempfile::TempDir, FileBlockFile) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = FileBlockFile::create(&p, len).unwrap();
        for (at, b) in bytes {
            f.write_at(b, *at).unwrap();
        }
        (dir, f)
    }

    #[test]
    fn zeros_are_empty_and_signatures_are_named() {
        let (_d, f) = file_with(&[], 8 << 20);
        assert_eq!(contents(&f).unwrap(), None);
        let (_d, f) = file_with(&[], 0);
        assert_eq!(contents(&f).unwrap(), None);
        let (_d, f) = file_with(&[(1080, &[0x53, 0xef])], 8 << 20);
        assert!(contents(&f).unwrap().unwrap().contains("ext2/3/4"));
        let (_d, f) = file_with(&[(65600, b"_BHRfS_M")], 8 << 20);
        assert!(contents(&f).unwrap().unwrap().contains("btrfs"));
        let (_d, f) = file_with(&[(4096, META_MAGIC)], 8 << 20);
        assert!(contents(&f).unwrap().unwrap().contains("dedup metadata"));
        let (_d, f) = file_with(&[(700_000, b"x")], 8 << 20);
        assert!(contents(&f).unwrap().unwrap().contains("not all zeros"));
    }

    #[test]
    fn one_file_for_both_halves_is_refused_by_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"").unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("b")).unwrap();
        assert!(distinct(&a, &dir.path().join("b")).is_err());
        assert!(distinct(&dir.path().join("new"), &dir.path().join("new")).is_err());
        distinct(&a, &dir.path().join("new")).unwrap();
    }
}
