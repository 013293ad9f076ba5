//! Driving fio's nbd engine and reading its JSON report.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::Value;

/// What a run writes: fresh random data, or one pattern over and over.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Dataset {
    /// Random data (Dmdedup's Unique): nothing deduplicates.
    Unique,
    /// One 4 KiB block repeated (Dmdedup's All-duplicates).
    Alldup,
    /// The --source tree as one tar stream, copied onto the device by nbdcopy.
    Tar,
    /// The --source tree extracted as files onto ext4 over the device.
    Files,
    /// The --source file copied as it is by nbdcopy: a disk image, or
    /// successive versions of one end to end (`scripts/image-versions`).
    Image,
}

impl Dataset {
    /// Written by fio (with --patterns), or by a real client as it writes.
    pub fn by_fio(self) -> bool {
        matches!(self, Dataset::Unique | Dataset::Alldup)
    }
}

/// How a run writes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential 640 KiB writes (Dmdedup §4.2.1).
    Seq640k,
    /// Random 4 KiB writes.
    Rand4k,
    /// As the client writes it (tar and files datasets).
    Stream,
}

impl Pattern {
    fn block(self) -> &'static str {
        match self {
            Pattern::Seq640k => "640k",
            Pattern::Rand4k | Pattern::Stream => "4k",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Write,
    Read,
}

pub struct Job<'a> {
    pub uri: &'a str,
    pub dataset: Dataset,
    pub pattern: Pattern,
    pub phase: Phase,
    /// Bytes of the device the run covers.
    pub span: u64,
    /// Most seconds the run may take.
    pub runtime_s: u64,
    pub iodepth: u32,
    pub jobs: u32,
    /// Send a FLUSH every this many writes (0: never).
    pub flush_every: u32,
}

/// One fio run's numbers.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    pub bytes: u64,
    pub mb_per_s: f64,
    pub iops: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
}

pub fn run(fio: &Path, job: &Job, output: &Path) -> anyhow::Result<Measured> {
    let rw = match (job.phase, job.pattern) {
        (Phase::Write, Pattern::Seq640k | Pattern::Stream) => "write",
        (Phase::Write, Pattern::Rand4k) => "randwrite",
        (Phase::Read, Pattern::Seq640k | Pattern::Stream) => "read",
        (Phase::Read, Pattern::Rand4k) => "randread",
    };
    let mut cmd = Command::new(fio);
    cmd.arg("--name=bench")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", job.uri))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={}", job.pattern.block()))
        .arg(format!("--size={}", job.span))
        .arg(format!("--iodepth={}", job.iodepth))
        .arg(format!("--numjobs={}", job.jobs))
        // Write the span once (as Dmdedup: until the device is full), capped
        // in time: never wrap, since overwriting a full device of unique
        // data needs room the device does not have.
        .arg(format!("--runtime={}", job.runtime_s))
        .arg("--group_reporting")
        .arg("--output-format=json")
        .arg(format!("--output={}", output.display()));
    match job.dataset {
        Dataset::Unique => cmd.arg("--refill_buffers=1"),
        Dataset::Alldup => cmd
            .arg("--scramble_buffers=0")
            .arg("--buffer_pattern=0x5eed5eed"),
        Dataset::Tar | Dataset::Files | Dataset::Image => {
            bail!("the {:?} dataset is not written by fio", job.dataset)
        }
    };
    if job.flush_every > 0 && job.phase == Phase::Write {
        cmd.arg(format!("--fsync={}", job.flush_every));
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", fio.display()))?;
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text =
        std::fs::read_to_string(output).with_context(|| format!("reading {}", output.display()))?;
    // fio may print notices before the JSON object.
    let json_start = text.find('{').context("fio wrote no JSON report")?;
    let v: Value =
        serde_json::from_str(&text[json_start..]).context("parsing fio's JSON report")?;
    let side = &v["jobs"][0][match job.phase {
        Phase::Write => "write",
        Phase::Read => "read",
    }];
    let pct = |p: &str| side["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Measured {
        bytes: side["io_bytes"].as_u64().unwrap_or(0),
        mb_per_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        iops: side["iops"].as_f64().unwrap_or(0.0),
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        lat_p999_us: pct("99.900000"),
    })
}
