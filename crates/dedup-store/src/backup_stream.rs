//! Backing up one stream: cut it into segments, keep each segment the index
//! (after checking its hint) finds already stored, write the new ones into
//! containers, then the recipe, then the backup object, in that order.
//! Only the last `put` makes the backup visible, so a backup that fails or
//! dies part-way leaves no backup, only unreferenced containers for GC.

use std::collections::HashMap;
use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use dedup_core::compress::Compression;
use dedup_core::fingerprint::Fingerprint;

use crate::backup::{validate_name, BackupRecord, BackupReport, RECIPES_PREFIX};
use crate::container::{container_name, Container};
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::recipe::{Recipe, SegmentRef};
use crate::repo::{random_bytes, Repository};
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::Segmenter;
use crate::writer::{ContainerWriter, HASH};

/// The container being filled, and what it holds so far (segments repeated
/// within it are found here: the index only learns of durable containers).
struct Open {
    writer: ContainerWriter,
    holds: HashMap<Fingerprint, u32>,
}

impl Repository {
    /// Back up `reader` as backup `name` in `group`.
    pub fn backup_stream(
        &mut self,
        name: &str,
        group: &str,
        reader: impl Read,
    ) -> RepoResult<BackupReport> {
        validate_name(name)?;
        validate_name(group)?;
        let object = BackupRecord::object_name(name);
        match self.store.get(&object) {
            Err(Error::NotFound { .. }) => {}
            Ok(_) => return Err(RepoError::BackupExists { name: name.into() }),
            Err(e) => return Err(e.into()),
        }
        let mut report = BackupReport::default();
        let mut recipe = Recipe::default();
        let mut open: Option<Open> = None;
        for segment in Segmenter::new(self.config.segmenting, reader) {
            let segment = segment.map_err(|cause| RepoError::Io {
                context: format!("reading the stream of backup {name}"),
                cause,
            })?;
            let fp = HASH.fingerprint(&segment);
            let len = segment.len() as u32;
            report.bytes_in += u64::from(len);
            let (container, entry) = if let Some(at) = self.find(&open, &fp) {
                report.segments_duplicate += 1;
                at
            } else {
                let o = match open.as_mut() {
                    Some(o) => o,
                    None => open.insert(self.new_container()),
                };
                let (_, i) = o.writer.add(&segment)?;
                o.holds.insert(fp, i as u32);
                report.segments_new += 1;
                report.bytes_new += u64::from(len);
                let at = (o.writer.id(), i as u32);
                if o.writer.is_full() {
                    self.put_container(open.take().expect("open"), &mut report)?;
                }
                at
            };
            recipe.segments.push(SegmentRef {
                container,
                entry,
                len,
                fingerprint: fp,
            });
        }
        if let Some(o) = open.take() {
            self.put_container(o, &mut report)?;
        }
        recipe.stream_len = report.bytes_in;
        let nonce = u64::from_le_bytes(random_bytes()?);
        let recipe_name = format!("{RECIPES_PREFIX}{name}-{nonce:016x}");
        self.store.put(&recipe_name, &recipe.encode())?;
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let record = BackupRecord {
            name: name.into(),
            group: group.into(),
            time,
            recipe: recipe_name,
            report,
        };
        // The commit point.
        self.store.put(&object, &record.encode())?;
        Ok(report)
    }

    /// Where segment `fp` is already stored: in the open container, or
    /// where the index says, once that container's catalog confirms it.
    fn find(&mut self, open: &Option<Open>, fp: &Fingerprint) -> Option<(u64, u32)> {
        if let Some(o) = open {
            if let Some(&i) = o.holds.get(fp) {
                return Some((o.writer.id(), i));
            }
        }
        let (container, entry) = self.index.lookup(fp)?;
        // A hint we cannot confirm (no such container, damaged catalog, no
        // such entry, another fingerprint) is ignored: storing the segment
        // again costs space, reusing a wrong one would lose data.
        let catalog = self.catalog(container).ok()?;
        let confirmed = catalog
            .entries()
            .get(entry as usize)
            .is_some_and(|e| e.fingerprint == *fp);
        confirmed.then_some((container, entry))
    }

    fn new_container(&mut self) -> Open {
        let id = self.next_container;
        self.next_container += 1;
        let target = usize::try_from(self.config.container_target).unwrap_or(usize::MAX);
        Open {
            writer: ContainerWriter::with_options(id, target, Compression::Lz4),
            holds: HashMap::new(),
        }
    }

    /// Seal and store a container, then tell the index about it.
    fn put_container(&mut self, open: Open, report: &mut BackupReport) -> RepoResult<()> {
        let id = open.writer.id();
        let name = container_name(id);
        let bytes = open.writer.seal();
        self.store.put(&name, &bytes)?;
        report.containers_written += 1;
        report.bytes_written += bytes.len() as u64;
        let container = Container::parse(&name, bytes)?;
        let catalog = container.catalog().clone();
        self.index.insert(id, catalog.entries());
        self.catalogs.insert(id, catalog);
        Ok(())
    }
}
