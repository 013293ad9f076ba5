//! `dedup status`: the device's statistics, live from the serving process
//! or read from a stopped device.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dedup_core::control::Request;
use dedup_core::stats::Stats;
use dedup_core::OpenOptions;

use super::shared::device::{reach, Reached};
use super::shared::report::print_json;
use crate::prometheus;
use crate::render::{self, StatusReport};

#[derive(clap::Args)]
#[command(
    about = "Show a device's statistics (dedup ratio, space, I/O counters)",
    after_help = "Examples:\n  dedup status ./dev\n  dedup status ./dev --json | jq .dedup_ratio\n  \
        dedup status /srv/dedup/a --prometheus\n  \
        dedup status /srv/dedup/a --prometheus-file /var/lib/prometheus/node-exporter/dedup-a.prom"
)]
pub struct Args {
    /// Device directory.
    pub dir: PathBuf,
    /// Print JSON (snake_case keys) instead of a table.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the statistics in the Prometheus text exposition format
    /// (counters `dedup_..._total`, gauges in bytes and ratios, every
    /// sample labelled `device="DIR"`).
    #[arg(long)]
    pub prometheus: bool,
    /// Also write the Prometheus text to FILE for node_exporter's textfile
    /// collector (name it *.prom in its directory): written to FILE.tmp,
    /// then renamed, so a scrape never reads half a file. FILE is made
    /// 0644: metrics are figures and the device path, never data. Alone,
    /// nothing is printed (for a timer).
    #[arg(long, value_name = "FILE")]
    pub prometheus_file: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (served, stats) = match reach(&a.dir, &Request::Status, &OpenOptions::default())? {
        Reached::Served(v) => (true, serde_json::from_value::<Stats>(v)?),
        Reached::Offline(dev) => (false, dev.stats()),
    };
    let report = StatusReport {
        device: a.dir.display().to_string(),
        served,
        stats,
    };
    let metrics = (a.prometheus || a.prometheus_file.is_some())
        .then(|| prometheus::render(&report.device, served, &report.stats));
    if let (Some(file), Some(text)) = (&a.prometheus_file, &metrics) {
        write_atomically(file, text)?;
    }
    if a.json {
        print_json(&report)?;
    } else if let (true, Some(text)) = (a.prometheus, &metrics) {
        out!("{text}");
    } else if a.prometheus_file.is_none() {
        out!("{}", render::status(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Write to FILE.tmp and rename it over FILE: the textfile collector reads
/// only *.prom files, and a rename is atomic, so it sees the old file or
/// the new one, never a part.
fn write_atomically(file: &Path, text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    // The mode given to open is masked by the umask (the plugin's is 077):
    // set it outright so node_exporter, another user, can read the file.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), file.display()))?;
    Ok(())
}
