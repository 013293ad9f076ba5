//! The systems a benchmark compares: the raw baseline (nbdkit's `file`
//! plugin over a file on the same storage) and dedup devices, each created
//! fresh for a run, served on a Unix socket, and removed afterwards.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use dedup_core::backends::{self, BackendParams};
use dedup_core::control::{self, Request};
use dedup_core::layout::{self, CreateOptions, CONTROL_SOCKET_NAME};
use dedup_core::stats::Stats;
use serde::Serialize;

use crate::cmd::nbdkit::{Listen, Nbdkit};

#[derive(Clone, Debug, Serialize)]
pub struct System {
    pub label: String,
    /// `raw`, or a backend name.
    pub kind: String,
    /// Metadata cache as a share of the metadata size (percent).
    pub cache_pct: Option<f64>,
    /// Writes per transaction (cowbtree, lsm).
    pub txn_writes: Option<u64>,
    /// How chunks are compressed (dedup systems; None: none).
    #[serde(default)]
    pub compression: Option<String>,
    /// sparse: the hash index's RAM budget (None: the default).
    #[serde(default)]
    pub index_memory: Option<u64>,
    /// sparse: of that budget, the prefetch cache's (None: an eighth).
    #[serde(default)]
    pub index_cache: Option<u64>,
}

impl System {
    pub fn raw() -> System {
        System {
            label: "raw".into(),
            kind: "raw".into(),
            cache_pct: None,
            txn_writes: None,
            compression: None,
            index_memory: None,
            index_cache: None,
        }
    }

    /// The same system with a hash index budget of `bytes` (named in the
    /// label).
    pub fn with_index_memory(mut self, bytes: u64) -> System {
        // Exact, so that budgets a KiB apart get labels of their own.
        let size = match bytes {
            b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
            b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
            b => b.to_string(),
        };
        self.label.push_str(&format!(" ix{size}"));
        self.index_memory = Some(bytes);
        self
    }

    /// The same system with chunks compressed by `codec` (named in the
    /// label when `labelled`).
    pub fn with_compression(mut self, codec: &str, labelled: bool) -> System {
        if labelled {
            self.label.push_str(&format!(" {codec}"));
        }
        self.compression = Some(codec.to_string());
        self
    }

    pub fn dedup(backend: &str, cache_pct: Option<f64>, txn_writes: Option<u64>) -> System {
        let mut label = backend.to_string();
        if let Some(c) = cache_pct {
            label.push_str(&format!(" c{c}%"));
        }
        match txn_writes {
            Some(0) => label.push_str(" t∞"),
            Some(t) => label.push_str(&format!(" t{t}")),
            None => {}
        }
        System {
            label,
            kind: backend.to_string(),
            cache_pct,
            txn_writes,
            compression: None,
            index_memory: None,
            index_cache: None,
        }
    }
}

pub struct Tools {
    pub nbdkit: PathBuf,
    pub plugin: PathBuf,
    pub threads: u32,
    /// Every write with FUA (nbdkit's fua filter, fuamode=force).
    pub sync: bool,
}

pub struct Running {
    server: Nbdkit,
    pub uri: String,
    /// The system's own directory (scratch space for mounts goes here too).
    pub dir: PathBuf,
    control: Option<PathBuf>,
}

fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// Create the system's storage in `workdir` and serve it.
pub fn start(system: &System, workdir: &Path, size: u64, tools: &Tools) -> anyhow::Result<Running> {
    let dir = workdir.join(sanitize(&system.label));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (plugin_args, control): (Vec<OsString>, Option<PathBuf>) = if system.kind == "raw" {
        let img = dir.join("raw.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(size))
            .with_context(|| format!("creating {}", img.display()))?;
        (vec!["file".into(), img.into()], None)
    } else {
        let dev = dir.join("dev");
        let mut opts = CreateOptions::new(size);
        opts.backend = system.kind.clone();
        opts.compression = dedup_core::compress::Compression::parse(
            system.compression.as_deref().unwrap_or("none"),
        )?;
        let probe = dedup_core::config::DeviceConfig {
            uuid: [0; 16],
            backend: system.kind.clone(),
            chunk_size: opts.chunk_size,
            hash: opts.hash,
            verify: false,
            logical_size: size,
            physical_chunks: size / opts.chunk_size as u64,
            compression: dedup_core::compress::Compression::None,
        };
        let reference = dedup_core::registry::metadata_reference_bytes(&probe);
        let defaults = BackendParams::default();
        opts.params = BackendParams {
            cache_bytes: system
                .cache_pct
                .map(|p| ((reference as f64 * p / 100.0) as u64).max(backends::MIN_CACHE_BYTES))
                .unwrap_or(defaults.cache_bytes),
            txn_writes: system.txn_writes.unwrap_or(defaults.txn_writes),
            index_memory: system.index_memory.unwrap_or(defaults.index_memory),
            ..defaults
        };
        layout::create(&dev, &opts)?;
        (
            [
                tools.plugin.clone().into(),
                format!("dir={}", dev.display()).into(),
            ]
            .into_iter()
            .chain(
                system
                    .index_cache
                    .map(|c| format!("index_cache={c}").into()),
            )
            .collect(),
            Some(dev.join(CONTROL_SOCKET_NAME)),
        )
    };
    let plugin_args = if tools.sync {
        // Synchronous writes: each is durable when acknowledged, on every
        // system alike (the file plugin then fdatasyncs per write).
        let mut v: Vec<OsString> = vec!["--filter=fua".into()];
        v.extend(plugin_args);
        v.push("fuamode=force".into());
        v
    } else {
        plugin_args
    };
    let listen = Listen::Unix(dir.join("nbd.sock"));
    let mut server = Nbdkit::spawn(
        &tools.nbdkit,
        &listen,
        &dir.join("nbdkit.pid"),
        tools.threads,
        &[],
        &plugin_args,
    )?;
    let ready = server.wait_ready(|| control.as_ref().is_none_or(|c| c.exists()))?;
    if let Some(status) = ready {
        bail!(
            "nbdkit for {} stopped before serving ({status})",
            system.label
        );
    }
    Ok(Running {
        server,
        uri: listen.uri(),
        dir,
        control,
    })
}

impl Running {
    pub fn cpu_seconds(&self) -> f64 {
        self.server.cpu_seconds().unwrap_or(0.0)
    }

    /// The dedup device's statistics (None for the raw baseline).
    pub fn stats(&self) -> anyhow::Result<Option<Stats>> {
        let Some(control) = &self.control else {
            return Ok(None);
        };
        match control::request(control, &Request::Status)? {
            Some(v) => Ok(Some(serde_json::from_value(v)?)),
            None => bail!("the device stopped answering on {}", control.display()),
        }
    }

    /// Run garbage collection on a dedup device (no-op for raw).
    pub fn gc(&self) -> anyhow::Result<()> {
        let Some(control) = &self.control else {
            return Ok(());
        };
        match control::request(control, &Request::Gc)? {
            Some(_) => Ok(()),
            None => bail!("the device stopped answering on {}", control.display()),
        }
    }

    /// The raw baseline's allocated image bytes (None for dedup devices).
    pub fn raw_allocated_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        if self.control.is_some() {
            return None;
        }
        std::fs::metadata(self.dir.join("raw.img"))
            .ok()
            .map(|m| m.blocks() * 512)
    }

    /// Stop the server and delete the storage.
    pub fn finish(self) -> anyhow::Result<()> {
        let status = self.server.stop()?;
        let _ = std::fs::remove_dir_all(&self.dir);
        if !status.success() {
            bail!("nbdkit exited with {status}");
        }
        Ok(())
    }
}
