//! Checksums of fjall's files, recorded at a clean stop in the metadata
//! device after our superblock, and checked before fjall opens them again:
//! fjall aborts the process on some damaged files instead of returning an
//! error, so damage done at rest is caught here first. (After an unclean
//! stop the files legitimately changed, and fjall's own recovery runs.)

use std::path::{Path, PathBuf};

use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::error::{Error, IoContext, Result};
use crate::superblock::SUPERBLOCK_AREA;

const MAGIC: &[u8; 8] = b"DDUPSUMS";
const S: &str = "lsm file checksums";

/// Files up to this size are checksummed whole; larger ones at both ends,
/// where fjall keeps the headers, trailers and tables of contents it parses
/// without checksums of its own (its data blocks and journal entries carry
/// xxh3 checksums that fjall does check).
const WHOLE: u64 = 256 << 10;
const ENDS: u64 = 64 << 10;

fn file_sum(path: &Path) -> Result<(u64, u32)> {
    use std::io::{Read, Seek, SeekFrom};
    let what = || format!("reading {}", path.display());
    let mut f = std::fs::File::open(path).context(what)?;
    let len = f.metadata().context(what)?.len();
    let mut crc = 0;
    let mut buf = Vec::new();
    if len <= WHOLE {
        f.read_to_end(&mut buf).context(what)?;
        crc = crc32c::crc32c_append(crc, &buf);
    } else {
        for start in [0, len - ENDS] {
            buf.resize(ENDS as usize, 0);
            f.seek(SeekFrom::Start(start)).context(what)?;
            f.read_exact(&mut buf).context(what)?;
            crc = crc32c::crc32c_append(crc, &buf);
        }
    }
    Ok((len, crc))
}

fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, u64, u32)>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .context(|| format!("listing {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .context(|| format!("listing {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        if path.is_dir() {
            walk(&path, base, out)?;
        } else {
            let rel = path
                .strip_prefix(base)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            let (len, crc) = file_sum(&path)?;
            out.push((rel, len, crc));
        }
    }
    Ok(())
}

fn list(dir: &Path) -> Result<Vec<(String, u64, u32)>> {
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

pub fn record(meta: &dyn BlockFile, dir: &Path) -> Result<()> {
    let files = list(dir)?;
    let mut e = Encoder::default();
    e.bytes(MAGIC).u32(files.len() as u32);
    for (name, len, crc) in &files {
        e.u32(name.len() as u32)
            .bytes(name.as_bytes())
            .u64(*len)
            .u32(*crc);
    }
    let n = e.buf.len() + 4;
    e.pad_to(n);
    let mut rec = e.buf;
    seal(&mut rec);
    let mut with_len = (rec.len() as u64).to_le_bytes().to_vec();
    with_len.extend_from_slice(&rec);
    meta.write_at(&with_len, SUPERBLOCK_AREA)?;
    meta.sync()
}

pub fn verify(meta: &dyn BlockFile, dir: &Path) -> Result<()> {
    if meta.len()? < SUPERBLOCK_AREA + 8 {
        return Err(Error::corrupt(
            S,
            "missing (the metadata file is too short)",
        ));
    }
    let mut len = [0u8; 8];
    meta.read_at(&mut len, SUPERBLOCK_AREA)?;
    let len = u64::from_le_bytes(len);
    if !(16..=64 << 20).contains(&len) || SUPERBLOCK_AREA + 8 + len > meta.len()? {
        return Err(Error::corrupt(
            S,
            format!("implausible record length {len}"),
        ));
    }
    let mut rec = vec![0u8; len as usize];
    meta.read_at(&mut rec, SUPERBLOCK_AREA + 8)?;
    if &rec[..8] != MAGIC || !is_sealed(&rec) {
        return Err(Error::corrupt(S, "record fails its checksum"));
    }
    let mut d = Decoder::new(&rec[8..], S);
    let count = d.u32()?;
    let mut want = Vec::new();
    for _ in 0..count {
        let n = d.u32()? as usize;
        let name = String::from_utf8(d.bytes(n)?.to_vec())
            .map_err(|_| Error::corrupt(S, "file name is not text"))?;
        want.push((name, d.u64()?, d.u32()?));
    }
    let have = list(dir)?;
    if have != want {
        // A file changed in place is both missing (as recorded) and new
        // (as found): name it once.
        let changed: std::collections::BTreeSet<PathBuf> = want
            .iter()
            .filter(|w| !have.contains(w))
            .map(|w| dir.join(&w.0))
            .chain(
                have.iter()
                    .filter(|h| !want.contains(h))
                    .map(|h| dir.join(&h.0)),
            )
            .collect();
        return Err(Error::corrupt(
            "lsm tables",
            format!(
                "files changed since the last clean stop (damaged or tampered with): {}; {}",
                changed
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::backends::NOT_REBUILT
            ),
        ));
    }
    Ok(())
}
