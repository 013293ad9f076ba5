//! The two headers that identify a device: the metadata superblock (two
//! alternating 4 KiB slots at the start of the metadata device) and the data
//! header (4 KiB at the start of the data device). Layouts are in FORMATS.md.
//!
//! This module owns encoding, checking and writing these headers; it never
//! interprets the backend area, which belongs to the backend named inside.

use std::path::Path;
use std::sync::Arc;

use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::compress::Compression;
use crate::config::{validate_chunk_size, DeviceConfig, DATA_OFFSET};
use crate::error::{Error, Result};
use crate::fingerprint::HashAlgo;
use crate::generation::{self, Recorded, Witness, IDENTITY_LEN};

pub const SUPERBLOCK_SIZE: usize = 4096;
/// Both superblock slots; metadata payloads start after them.
pub const SUPERBLOCK_AREA: u64 = 2 * SUPERBLOCK_SIZE as u64;
pub const FORMAT_VERSION: u32 = 1;
pub(crate) const META_MAGIC: &[u8; 8] = b"DDUPMETA";
pub(crate) const DATA_MAGIC: &[u8; 8] = b"DDUPDATA";
const HEADER_FIELDS: usize = 96;
const BACKEND_AREA_OFFSET: usize = 1024;
/// Bytes a backend may keep in the superblock (its root pointers, section table...).
pub const BACKEND_AREA_SIZE: usize = SUPERBLOCK_SIZE - 4 - BACKEND_AREA_OFFSET;
const BACKEND_NAME_LEN: usize = 16;

/// Whether the device was shut down cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceState {
    /// Closed cleanly: all metadata is on the metadata device.
    Clean,
    /// Open (or crashed while open): metadata may be newer in memory than on disk.
    Open,
}

impl DeviceState {
    fn code(self) -> u8 {
        match self {
            DeviceState::Clean => 1,
            DeviceState::Open => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(DeviceState::Clean),
            2 => Some(DeviceState::Open),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Superblock {
    pub generation: u64,
    pub config: DeviceConfig,
    pub state: DeviceState,
    /// Opaque to everyone but the backend named in `config.backend`.
    pub backend_area: Vec<u8>,
    /// Read: the other slot has our magic but does not decode (damage or
    /// a torn write; the data's generation tells which).
    pub damaged_slot: bool,
    /// Where `write` records each generation on the data device (set by
    /// the engine on a device opened for writing).
    pub witness: Option<Arc<Witness>>,
    /// The data device as a journaled store checks its journal's last
    /// transaction against it at recovery, and lists what each commit
    /// wrote to it (`blockfile/written.rs`; set by the engine).
    pub data_check: Option<crate::blockfile::written::DataCheck>,
    /// What the data device recorded of this metadata, once `check_data`
    /// read it: the store compares its own last commit once it has read it
    /// (`generation::check_commit`).
    pub recorded: Recorded,
    /// The data device `recorded` was read from, for messages.
    pub recorded_from: std::path::PathBuf,
}

impl Superblock {
    pub fn new(config: DeviceConfig) -> Self {
        Superblock {
            generation: 0,
            config,
            state: DeviceState::Clean,
            backend_area: vec![0; BACKEND_AREA_SIZE],
            damaged_slot: false,
            witness: None,
            data_check: None,
            recorded: Recorded::default(),
            recorded_from: std::path::PathBuf::new(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let c = &self.config;
        let mut name = [0u8; BACKEND_NAME_LEN];
        let nb = c.backend.as_bytes();
        name[..nb.len().min(BACKEND_NAME_LEN)]
            .copy_from_slice(&nb[..nb.len().min(BACKEND_NAME_LEN)]);
        let mut e = Encoder::with_capacity(SUPERBLOCK_SIZE);
        e.bytes(META_MAGIC)
            .u32(FORMAT_VERSION)
            .u32(HEADER_FIELDS as u32)
            .u64(self.generation)
            .bytes(&c.uuid)
            .bytes(&name)
            .u32(c.chunk_size)
            .u8(c.hash.code())
            .u8(c.verify as u8)
            .u8(self.state.code())
            .u8(c.compression.code())
            .u64(c.logical_size)
            .u64(c.physical_chunks)
            .u64(DATA_OFFSET)
            .pad_to(BACKEND_AREA_OFFSET);
        let mut area = self.backend_area.clone();
        area.resize(BACKEND_AREA_SIZE, 0);
        e.bytes(&area).pad_to(SUPERBLOCK_SIZE);
        let mut block = e.buf;
        seal(&mut block);
        block
    }

    fn decode(block: &[u8], path: &Path) -> Result<Superblock> {
        const S: &str = "superblock";
        let mut d = Decoder::new(block, S);
        if d.bytes(8)? != META_MAGIC {
            return Err(Error::foreign(
                path,
                "not a dedup metadata device (no superblock magic); check the --meta path",
            ));
        }
        if !is_sealed(block) {
            return Err(Error::corrupt(S, "checksum mismatch"));
        }
        let version = d.u32()?;
        if version != FORMAT_VERSION {
            return Err(Error::Unsupported(format!(
                "{}: metadata format version {version} is not supported by this dedup (it reads version {FORMAT_VERSION}); use a matching dedup release",
                path.display()
            )));
        }
        d.skip(4)?;
        let generation = d.u64()?;
        let uuid = d.array::<16>()?;
        let name = d.array::<BACKEND_NAME_LEN>()?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let backend = std::str::from_utf8(&name[..end])
            .map_err(|_| Error::corrupt(S, "backend name is not text"))?
            .to_string();
        let chunk_size = d.u32()?;
        let hash_code = d.u8()?;
        let hash = (HashAlgo::from_code(hash_code).or_else(|| test_hash(hash_code)))
            .ok_or_else(|| Error::corrupt(S, format!("unknown hash algorithm code {hash_code}")))?;
        let verify = match d.u8()? {
            0 => false,
            1 => true,
            v => return Err(Error::corrupt(S, format!("bad verify flag {v}"))),
        };
        let state_code = d.u8()?;
        let state = DeviceState::from_code(state_code)
            .ok_or_else(|| Error::corrupt(S, format!("unknown device state {state_code}")))?;
        // Reserved (0) before compression existed: 0 reads as none.
        let compression_code = d.u8()?;
        let compression = Compression::from_code(compression_code).ok_or_else(|| {
            Error::corrupt(S, format!("unknown compression code {compression_code}"))
        })?;
        let logical_size = d.u64()?;
        let physical_chunks = d.u64()?;
        let data_offset = d.u64()?;
        if data_offset != DATA_OFFSET {
            return Err(Error::corrupt(
                S,
                format!("data offset {data_offset}, expected {DATA_OFFSET}"),
            ));
        }
        validate_chunk_size(chunk_size).map_err(|e| Error::corrupt(S, e.to_string()))?;
        let config = DeviceConfig {
            uuid,
            backend,
            chunk_size,
            hash,
            verify,
            logical_size,
            physical_chunks,
            compression,
        };
        config
            .validate()
            .map_err(|e| Error::corrupt(S, e.to_string()))?;
        let backend_area =
            block[BACKEND_AREA_OFFSET..BACKEND_AREA_OFFSET + BACKEND_AREA_SIZE].to_vec();
        Ok(Superblock {
            generation,
            config,
            state,
            backend_area,
            damaged_slot: false,
            witness: None,
            data_check: None,
            recorded: Recorded::default(),
            recorded_from: std::path::PathBuf::new(),
        })
    }

    /// Read the newest valid superblock slot of a metadata device.
    pub fn read(file: &dyn BlockFile, path: &Path) -> Result<Superblock> {
        let len = file.len()?;
        if len < SUPERBLOCK_AREA {
            return Err(Error::foreign(
                path,
                format!("too small ({len} bytes) to be a dedup metadata device"),
            ));
        }
        let mut best: Option<Superblock> = None;
        let mut first_err = None;
        let mut damaged = false;
        for slot in 0..2u64 {
            let mut block = vec![0u8; SUPERBLOCK_SIZE];
            file.read_at(&mut block, slot * SUPERBLOCK_SIZE as u64)?;
            let decoded = Superblock::decode(&block, path);
            // Our magic on a slot that does not decode: damage, or a torn write.
            damaged |= matches!(decoded, Err(Error::Corrupt { .. } | Error::Unsupported(_)));
            match decoded {
                Ok(sb) if best.as_ref().is_none_or(|b| sb.generation > b.generation) => {
                    best = Some(sb)
                }
                Ok(_) => {}
                // A slot with our magic explains more than one without.
                Err(e) => match (&first_err, &e) {
                    (None, _)
                    | (
                        Some(Error::Foreign { .. }),
                        Error::Corrupt { .. } | Error::Unsupported(_),
                    ) => first_err = Some(e),
                    _ => {}
                },
            }
        }
        match (best, first_err) {
            (Some(sb), _) => Ok(Superblock {
                damaged_slot: damaged,
                ..sb
            }),
            (None, Some(e)) => Err(e),
            (None, None) => Err(Error::corrupt("superblock", "no valid slot")),
        }
    }

    /// Check `data` (at `data_path`) against this superblock (read from
    /// `meta_path`): it belongs to this device (`check_data_header`), and
    /// this metadata is not older than the generation it last recorded
    /// (`Error::Stale`, `generation.rs`).
    pub fn check_data(
        &mut self,
        data: &dyn BlockFile,
        meta_path: &Path,
        data_path: &Path,
    ) -> Result<()> {
        let recorded = check_data_header(data, data_path, &self.config)?;
        self.recorded = recorded;
        self.recorded_from = data_path.to_path_buf();
        generation::check(
            self.generation,
            recorded.generation,
            self.damaged_slot,
            meta_path,
            data_path,
        )
    }

    /// Write the next generation into the slot not holding the current one,
    /// and sync: a torn write leaves the other slot valid. Then record the
    /// generation on the data device (`generation.rs`).
    pub fn write(&mut self, file: &dyn BlockFile) -> Result<()> {
        self.generation += 1;
        let slot = self.generation % 2;
        file.write_at(&self.encode(), slot * SUPERBLOCK_SIZE as u64)?;
        file.sync()?;
        if let Some(w) = &self.witness {
            w.record(self.generation);
        }
        Ok(())
    }
}

/// Encode the data device header.
pub fn encode_data_header(config: &DeviceConfig) -> Vec<u8> {
    let mut e = Encoder::with_capacity(DATA_OFFSET as usize);
    e.bytes(DATA_MAGIC)
        .u32(FORMAT_VERSION)
        .u32(0)
        .bytes(&config.uuid)
        .u32(config.chunk_size)
        .u32(0)
        .u64(config.physical_chunks)
        .pad_to(IDENTITY_LEN);
    let mut block = e.buf;
    seal(&mut block);
    block.resize(DATA_OFFSET as usize, 0);
    block
}

/// Check that a data device belongs to the device described by `config`;
/// the generation it last recorded (`generation.rs`).
pub fn check_data_header(
    file: &dyn BlockFile,
    path: &Path,
    config: &DeviceConfig,
) -> Result<Recorded> {
    let len = file.len()?;
    if len < config.data_device_len() {
        return Err(Error::foreign(
            path,
            format!(
                "data device is {len} bytes but the device needs {} (was it truncated or swapped?)",
                config.data_device_len()
            ),
        ));
    }
    let mut block = vec![0u8; DATA_OFFSET as usize];
    file.read_at(&mut block, 0)?;
    let mut d = Decoder::new(&block, "data header");
    if d.bytes(8)? != DATA_MAGIC {
        return Err(Error::foreign(
            path,
            "not a dedup data device (no data header magic); check the --data path",
        ));
    }
    // Devices made before generations sealed the whole block.
    if !is_sealed(&block[..IDENTITY_LEN]) && !is_sealed(&block) {
        return Err(Error::corrupt("data header", "checksum mismatch"));
    }
    d.skip(8)?;
    let uuid = d.array::<16>()?;
    if uuid != config.uuid {
        return Err(Error::foreign(
            path,
            format!(
                "this data device belongs to device {}, not to {} recorded in the metadata; the data and metadata paths are mismatched",
                uuid::Uuid::from_bytes(uuid),
                config.uuid_string()
            ),
        ));
    }
    generation::read(file, &config.uuid)
}

/// The verify-mode unit tests' 4-bit hash, which `HashAlgo::from_code`
/// never names: only those tests' devices open with it.
#[cfg(test)]
fn test_hash(code: u8) -> Option<HashAlgo> {
    (code == HashAlgo::Weak4.code()).then_some(HashAlgo::Weak4)
}

#[cfg(not(test))]
fn test_hash(_: u8) -> Option<HashAlgo> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::MemBlockFile;

    fn config() -> DeviceConfig {
        DeviceConfig {
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            backend: "inram".into(),
            chunk_size: 4096,
            hash: HashAlgo::Sha256,
            verify: true,
            logical_size: 1 << 30,
            physical_chunks: 1000,
            compression: crate::compress::Compression::None,
        }
    }

    #[test]
    fn superblock_round_trips_and_newest_slot_wins() {
        let f = MemBlockFile::new(SUPERBLOCK_AREA, "meta");
        let mut sb = Superblock::new(config());
        sb.backend_area[0..4].copy_from_slice(b"abcd");
        sb.write(&f).unwrap();
        sb.state = DeviceState::Open;
        sb.write(&f).unwrap();
        let back = Superblock::read(&f, Path::new("meta")).unwrap();
        assert_eq!(back.generation, 2);
        assert_eq!(back.state, DeviceState::Open);
        assert_eq!(back.config, sb.config);
        assert_eq!(&back.backend_area[0..4], b"abcd");
    }

    #[test]
    fn a_torn_newest_slot_falls_back_to_the_older_one() {
        let f = MemBlockFile::new(SUPERBLOCK_AREA, "meta");
        let mut sb = Superblock::new(config());
        sb.write(&f).unwrap(); // generation 1 -> slot 1
        sb.state = DeviceState::Open;
        sb.write(&f).unwrap(); // generation 2 -> slot 0
        f.write_at(&[0xff; 512], 512).unwrap(); // tear slot 0
        let back = Superblock::read(&f, Path::new("meta")).unwrap();
        assert_eq!(back.generation, 1);
        assert_eq!(back.state, DeviceState::Clean);
    }

    #[test]
    fn foreign_and_corrupt_superblocks_are_refused_by_name() {
        let f = MemBlockFile::new(SUPERBLOCK_AREA, "meta");
        let err = Superblock::read(&f, Path::new("meta")).unwrap_err();
        assert!(matches!(err, Error::Foreign { .. }), "{err}");
        let mut sb = Superblock::new(config());
        sb.write(&f).unwrap();
        f.write_at(&[1], 4096 + 100).unwrap();
        let err = Superblock::read(&f, Path::new("meta")).unwrap_err();
        assert!(err.to_string().contains("superblock"), "{err}");
    }

    #[test]
    fn a_superblock_of_an_unknown_version_is_refused_by_name() {
        let f = MemBlockFile::new(SUPERBLOCK_AREA, "meta");
        let mut sb = Superblock::new(config());
        sb.write(&f).unwrap();
        let mut block = vec![0u8; SUPERBLOCK_SIZE];
        f.read_at(&mut block, SUPERBLOCK_SIZE as u64).unwrap();
        block[8..12].copy_from_slice(&7u32.to_le_bytes());
        seal(&mut block);
        f.write_at(&block, SUPERBLOCK_SIZE as u64).unwrap();
        let err = Superblock::read(&f, Path::new("meta"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format version 7") && err.contains("matching dedup"),
            "{err}"
        );
    }

    #[test]
    fn data_header_must_match_the_metadata() {
        let cfg = config();
        let f = MemBlockFile::new(cfg.data_device_len(), "data");
        f.write_at(&encode_data_header(&cfg), 0).unwrap();
        check_data_header(&f, Path::new("data"), &cfg).unwrap();
        let mut other = cfg.clone();
        other.uuid = [9; 16];
        let err = check_data_header(&f, Path::new("data"), &other).unwrap_err();
        assert!(err.to_string().contains("mismatched"), "{err}");
        let blank = MemBlockFile::new(cfg.data_device_len(), "data");
        assert!(check_data_header(&blank, Path::new("data"), &cfg).is_err());
    }
}
