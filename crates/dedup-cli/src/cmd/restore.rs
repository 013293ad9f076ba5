//! `dedup restore`: write a backup's stream to a new file or to stdout.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use dedup_core::size::format_size;

use super::backup::mb_per_sec;

#[derive(clap::Args)]
#[command(
    about = "Restore a backup to a file or to standard output",
    after_help = "Restoring reads the backup's recipe and the containers it names; every segment is checked against its catalog, and a damaged or missing container or recipe is refused by name. A file TARGET must not exist unless --force (it is then replaced); if the restore fails, the partial file is removed.\n\nExamples:\n  dedup restore ./repo home-monday home.tar\n  dedup restore ./repo home-monday - | tar -xf - -C /restore"
)]
pub struct Args {
    /// Repository directory.
    pub repo: PathBuf,
    /// Backup to restore (see `dedup list`).
    pub name: String,
    /// File to create, or `-` for standard output.
    pub target: PathBuf,
    /// Replace TARGET if it exists.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let repo = super::store::open_read_only(&a.repo)?;
    // Fail on an unknown name before creating the target.
    repo.backup(&a.name)?;
    let start = Instant::now();
    if a.target.as_os_str() == "-" {
        let stdout = io::stdout();
        let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
        let n = repo.restore(&a.name, &mut out)?;
        out.flush().context("writing to standard output")?;
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "Restored {} of backup {} to standard output ({:.1} s, {:.1} MB/s).",
            format_size(n),
            a.name,
            s,
            mb_per_sec(n, s)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = OpenOptions::new();
    opts.write(true);
    if a.force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let file = opts.open(&a.target).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} already exists; refusing to overwrite it (use --force to replace it)",
                a.target.display()
            )
        } else {
            anyhow::anyhow!("creating {}: {e}", a.target.display())
        }
    })?;
    match write_to(&repo, &a.name, file) {
        Ok(n) => {
            let s = start.elapsed().as_secs_f64();
            println!(
                "Restored {} of backup {} to {} ({:.1} s, {:.1} MB/s).",
                format_size(n),
                a.name,
                a.target.display(),
                s,
                mb_per_sec(n, s)
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let _ = fs::remove_file(&a.target);
            Err(e.context(format!(
                "restoring backup {} (the partial {} was removed)",
                a.name,
                a.target.display()
            )))
        }
    }
}

fn write_to(repo: &dedup_store::Repository, name: &str, file: File) -> anyhow::Result<u64> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let n = repo.restore(name, &mut out)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(n)
}
