//! `dedup create`: lay out a new device.

use std::path::PathBuf;
use std::process::ExitCode;

use dedup_core::backends::BackendParams;
use dedup_core::compress::Compression;
use dedup_core::config::DEFAULT_CHUNK_SIZE;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::layout::{self, CreateOptions};
use dedup_core::size::format_size;

use super::shared::args::{compression_arg, index_memory_arg, size_arg};
use super::shared::report::print_json;
use crate::render;

#[derive(clap::Args)]
#[command(
    about = "Create a new deduplicated device in a directory",
    after_help = "Examples:\n  dedup create ./dev --size 10G\n  dedup create ./dev --size 10G --physical-size 2G --compression zstd:3\n  dedup create ./dev --size 1T --physical-size 200G --hash sha256 --verify\n  dedup create ./dev --size 100G --data /dev/sdb --meta /dev/nvme0n1p3\n\nWhat it costs (sparse, the default): metadata grows by about 45 bytes per stored chunk (about 11 GiB per TiB of unique data in 4K chunks) and costs nothing for space never written; a journal as large as the largest commit comes on top. RAM: --cache plus up to --index-memory (about 4 bytes per fingerprint, 1 GB per TB of unique data; past that the index samples and finds fewer duplicates: about 97% at 1/32 of a full index when copies come in the order first written, far fewer for data in another order, e.g. half at 1/16 for shuffled copies; `dedup status` says how many it missed) plus 4 bytes per 4 MiB of data space. create prints the figures for the device it makes."
)]
pub struct Args {
    /// Directory for the device (created 0700 if missing; must not hold a
    /// device). The files made in it are 0600: yours alone.
    pub dir: PathBuf,
    /// Logical size clients see (K, M, G, T suffixes); a multiple of the chunk size.
    #[arg(long, value_parser = size_arg)]
    pub size: u64,
    /// Data capacity to store chunks in; may be less than --size when you
    /// expect duplicates. Default: the size of an existing --data device, else --size.
    #[arg(long, value_parser = size_arg)]
    pub physical_size: Option<u64>,
    /// Metadata backend.
    #[arg(long, default_value = dedup_core::registry::DEFAULT, value_parser = clap::builder::PossibleValuesParser::new(dedup_core::registry::names()))]
    pub backend: String,
    /// Chunk size: a power of two from 4K to 1M; match your filesystem's block size.
    #[arg(long, value_parser = size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    pub chunk_size: u64,
    /// Fingerprint hash.
    #[arg(long, default_value = "blake3", value_parser = ["blake3", "sha256", "md5"])]
    pub hash: String,
    /// Compare bytes on every fingerprint match before sharing a chunk.
    #[arg(long)]
    pub verify: bool,
    /// How new chunks are compressed: lz4 (fast), zstd or zstd:LEVEL
    /// (1-22; smaller, more CPU), or none. Compressed chunks are packed up
    /// to 14 to a block; a chunk that does not shrink by an eighth is
    /// stored raw. The thin backends compress into their own C-blocks and
    /// take lz4 or none.
    #[arg(long, default_value = "lz4", value_parser = compression_arg)]
    pub compression: Compression,
    /// Metadata cache for the disk-based backends (disktable buffer cache,
    /// cowbtree B-tree cache, lsm block cache); `dedup serve --cache` overrides it.
    #[arg(long, value_parser = size_arg, default_value = "64M")]
    pub cache: u64,
    /// sparse: RAM for the hash index (fingerprints of stored chunks, 16
    /// bytes each). Beyond what it holds it keeps a sample (1 in 2, 4, ...)
    /// and finds the rest by prefetching the neighbours of a sampled hit;
    /// deduplication a sample misses costs space, never correctness.
    #[arg(long, value_parser = index_memory_arg, default_value = "256M")]
    pub index_memory: u64,
    /// Writes per metadata transaction for cowbtree and lsm: 1 commits after
    /// every write, 0 only at FLUSH/FUA (and when the cache fills). Default 1000, as Dmdedup.
    #[arg(long, default_value_t = 1000)]
    pub txn_writes: u64,
    /// thin, ordered, ideal: new chunks per write window (ThinDedup §II-A).
    #[arg(long, default_value_t = 32)]
    pub window_blocks: u64,
    /// thin, ordered, ideal: the longest a window stays open, in ms (it
    /// ends at the next request after that; FLUSH and FUA end it at once).
    #[arg(long, default_value_t = 100)]
    pub window_ms: u64,
    /// Existing file or block device to hold the data (default: DIR/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Existing file or block device to hold the metadata (default: DIR/meta).
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// Overwrite --data/--meta devices that already hold a dedup device.
    #[arg(long)]
    pub force: bool,
    /// Print the new device's configuration as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let chunk_size = u32::try_from(a.chunk_size)
        .map_err(|_| anyhow::anyhow!("chunk size {} is too large (at most 1M)", a.chunk_size))?;
    let opts = CreateOptions {
        size: a.size,
        physical_size: a.physical_size,
        backend: a.backend,
        chunk_size,
        hash: a.hash.parse::<HashAlgo>()?,
        verify: a.verify,
        compression: a.compression,
        data: a.data,
        meta: a.meta,
        force: a.force,
        params: BackendParams {
            cache_bytes: a.cache,
            txn_writes: a.txn_writes,
            window: dedup_core::backends::WindowParams {
                blocks: a.window_blocks,
                ms: a.window_ms,
            },
            index_memory: a.index_memory,
        },
    };
    let cfg = layout::create(&a.dir, &opts)?;
    let sizing = dedup_core::registry::sizing(&cfg, &opts.params);
    if a.json {
        let mut v = serde_json::to_value(&cfg)?;
        if let (Some(obj), Some(s)) = (v.as_object_mut(), &sizing) {
            obj.insert("sizing".into(), serde_json::to_value(s)?);
        }
        print_json(&v)?;
    } else {
        outln!(
            "Created a dedup device in {}: {} logical, {} of chunk space, {} chunks, {} fingerprints{}, {} compression, {} backend.",
            a.dir.display(),
            format_size(cfg.logical_size),
            format_size(cfg.physical_size()),
            format_size(cfg.chunk_size as u64),
            cfg.hash,
            if cfg.verify { " (verified)" } else { "" },
            cfg.compression,
            cfg.backend
        );
        if let Some(s) = sizing {
            out!("{}", render::sizing(&s));
        }
        outln!("Serve it with:  dedup serve {}", a.dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
