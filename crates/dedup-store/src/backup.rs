//! Backups and backup groups (§3.1's File Manager): the backup object
//! `backups/<name>` records one backed-up stream, the group it belongs to,
//! its recipe and what backing it up cost. It is written last, after every
//! container and the recipe are durable: its `put` is the commit point.
//!
//! Body after the frame (magic `DDUPBKUP`, version 2): time (u64, seconds
//! since the Unix epoch), then the report's six u64 figures (bytes in, bytes
//! new, bytes written to containers, segments new, segments duplicate,
//! containers written), then name, group, recipe object name and tree
//! object name (empty for a stream), each a u16 length and UTF-8 bytes.
//! Version 1 (still read) has no tree name. Version 3 adds the device mark
//! of a backup by fingerprint (the device's UUID, 16 bytes, and the
//! changed-block tracking mark, u64); a record without one is still
//! written as version 2, so older builds read every other backup.

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, put_str, unframe_any, Reader};

const MAGIC: [u8; 8] = *b"DDUPBKUP";
const VERSION: u32 = 3;
pub const BACKUPS_PREFIX: &str = "backups/";
pub const RECIPES_PREFIX: &str = "recipes/";
/// Tree objects: a backup of files and directories keeps their metadata
/// here; the file contents are the backup's stream.
pub const TREES_PREFIX: &str = "trees/";
/// Longest backup or group name, leaving room for the prefixes and nonce.
pub const MAX_BACKUP_NAME: usize = 200;

/// What one backup cost and saved (also as the server sends it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupReport {
    /// Bytes read from the stream.
    pub bytes_in: u64,
    /// Raw bytes of the segments that were new (stored this time).
    pub bytes_new: u64,
    /// Bytes of containers written (compressed segments, catalogs, framing).
    pub bytes_written: u64,
    pub segments_new: u64,
    pub segments_duplicate: u64,
    pub containers_written: u64,
}

impl BackupReport {
    /// Bytes in per new byte stored: how many times over dedup folded the
    /// stream (infinite for a stream that stored nothing new, 1 for none).
    pub fn dedup_ratio(&self) -> f64 {
        if self.bytes_new == 0 {
            if self.bytes_in == 0 {
                1.0
            } else {
                f64::INFINITY
            }
        } else {
            self.bytes_in as f64 / self.bytes_new as f64
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupRecord {
    pub name: String,
    pub group: String,
    /// Seconds since the Unix epoch when the backup committed.
    pub time: u64,
    pub recipe: String,
    /// The tree object of a backup of files and directories; `None` for a
    /// stream.
    pub tree: Option<String>,
    pub report: BackupReport,
    /// A backup of a dedup device by its fingerprints: the device, and the
    /// mark its changed-block tracking started from once this backup had
    /// walked it (`backup_blocks.rs`).
    pub device_mark: Option<DeviceMark>,
}

/// Which device a backup by fingerprint walked, and the changed-block
/// tracking mark the device started from then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMark {
    pub device: [u8; 16],
    pub mark: u64,
}

impl BackupRecord {
    pub fn object_name(name: &str) -> String {
        format!("{BACKUPS_PREFIX}{name}")
    }

    pub fn encode(&self) -> Vec<u8> {
        let r = &self.report;
        let mut body = Vec::new();
        for v in [
            self.time,
            r.bytes_in,
            r.bytes_new,
            r.bytes_written,
            r.segments_new,
            r.segments_duplicate,
            r.containers_written,
        ] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut body, &self.name);
        put_str(&mut body, &self.group);
        put_str(&mut body, &self.recipe);
        put_str(&mut body, self.tree.as_deref().unwrap_or(""));
        match self.device_mark {
            None => frame(MAGIC, 2, &body),
            Some(m) => {
                body.extend_from_slice(&m.device);
                body.extend_from_slice(&m.mark.to_le_bytes());
                frame(MAGIC, VERSION, &body)
            }
        }
    }

    /// Decode `object`, which must be the backup object of the name inside.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<BackupRecord> {
        let (version, body) = unframe_any(object, MAGIC, 1..=VERSION, bytes)?;
        let mut r = Reader::new(object, body);
        let time = r.u64()?;
        let report = BackupReport {
            bytes_in: r.u64()?,
            bytes_new: r.u64()?,
            bytes_written: r.u64()?,
            segments_new: r.u64()?,
            segments_duplicate: r.u64()?,
            containers_written: r.u64()?,
        };
        let (name, group, recipe) = (r.str()?, r.str()?, r.str()?);
        let tree = if version >= 2 {
            r.str()?
        } else {
            String::new()
        };
        let device_mark = if version >= 3 {
            let device: [u8; 16] = r.bytes(16)?.try_into().expect("16 bytes");
            Some(DeviceMark {
                device,
                mark: r.u64()?,
            })
        } else {
            None
        };
        r.finish()?;
        let corrupt = |d: String| RepoError::corrupt(object, d);
        if BackupRecord::object_name(&name) != object {
            return Err(corrupt(format!("it names backup {name:?}")));
        }
        validate_name(&group).map_err(|e| corrupt(e.to_string()))?;
        let recipe_ok = recipe.strip_prefix(RECIPES_PREFIX).is_some_and(|r| {
            r.starts_with(&format!("{name}-")) && crate::name::validate(&recipe).is_ok()
        });
        if !recipe_ok {
            return Err(corrupt(format!(
                "recipe name {recipe:?} is not one of this backup's"
            )));
        }
        let tree = (!tree.is_empty()).then_some(tree);
        let tree_ok = tree.as_ref().is_none_or(|t| {
            t.strip_prefix(TREES_PREFIX)
                .is_some_and(|t| t.starts_with(&format!("{name}-")))
                && crate::name::validate(t).is_ok()
        });
        if !tree_ok {
            return Err(corrupt(format!(
                "tree name {tree:?} is not one of this backup's"
            )));
        }
        Ok(BackupRecord {
            name,
            group,
            time,
            recipe,
            tree,
            report,
            device_mark,
        })
    }
}

/// A backup or group name: one object-name component (A-Z a-z 0-9 . _ -,
/// not starting with `.`), at most `MAX_BACKUP_NAME` bytes.
pub fn validate_name(name: &str) -> RepoResult<()> {
    let bad = |reason: &str| {
        Err(RepoError::BadName {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.len() > MAX_BACKUP_NAME {
        return bad(&format!("longer than {MAX_BACKUP_NAME} bytes"));
    }
    if name.contains('/') {
        return bad("it holds '/'");
    }
    if let Err(e) = crate::name::validate(name) {
        return bad(&e.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tree: Option<&str>) -> BackupRecord {
        BackupRecord {
            name: "b".into(),
            group: "g".into(),
            time: 7,
            recipe: "recipes/b-0000000000000001".into(),
            tree: tree.map(String::from),
            report: BackupReport {
                bytes_in: 1,
                ..BackupReport::default()
            },
            device_mark: None,
        }
    }

    #[test]
    fn records_round_trip_with_and_without_a_tree_and_version_1_still_reads() {
        for tree in [None, Some("trees/b-0000000000000001")] {
            let r = record(tree);
            assert_eq!(BackupRecord::decode("backups/b", &r.encode()).unwrap(), r);
        }
        // Version 3 only with a device mark.
        let mut r = record(None);
        assert_eq!(r.encode()[8..12], 2u32.to_le_bytes());
        r.device_mark = Some(DeviceMark {
            device: [7; 16],
            mark: 0x1234_5678_9abc_def0,
        });
        let v3 = r.encode();
        assert_eq!(v3[8..12], 3u32.to_le_bytes());
        assert_eq!(BackupRecord::decode("backups/b", &v3).unwrap(), r);
        // Version 1: the same body without the tree name.
        let v2 = record(None).encode();
        let body = &v2[12..v2.len() - 4 - 2];
        let v1 = frame(MAGIC, 1, body);
        assert_eq!(
            BackupRecord::decode("backups/b", &v1).unwrap(),
            record(None)
        );
    }

    #[test]
    fn a_tree_of_another_backup_is_refused() {
        for bad in [
            "trees/other-0000000000000001",
            "recipes/b-1",
            "trees/b-x/../y",
        ] {
            let e = BackupRecord::decode("backups/b", &record(Some(bad)).encode()).expect_err(bad);
            assert!(e.to_string().contains("tree name"), "{bad}: {e}");
        }
    }
}
