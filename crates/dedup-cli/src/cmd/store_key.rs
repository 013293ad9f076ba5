//! `dedup store key list|add|remove REPO`: the passphrases that open an
//! encrypted repository (`dedup_store::repo::KeyInfo`). Each is a key
//! object wrapping the one master key, so adding or removing one
//! re-encrypts nothing.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use dedup_store::crypto::KdfParams;
use dedup_store::{RepoLocation, Repository};
use serde::Serialize;
use zeroize::Zeroizing;

use super::shared::report::print_json;

#[derive(clap::Args)]
#[command(
    about = "List, add or remove the passphrases of an encrypted repository",
    after_help = "Every command opens the repository with the current passphrase (--password-file FILE, DEDUP_PASSWORD or DEDUP_PASSWORD_FILE). A new passphrase comes from --new-password-file FILE or DEDUP_NEW_PASSWORD. The key the current passphrase opens cannot be removed, so the last key never goes.\n\nExamples:\n  dedup store key list s3://backups/hosts\n  DEDUP_NEW_PASSWORD=... dedup store key add s3://backups/hosts\n  dedup store key remove s3://backups/hosts 3f2a9c0d1e4b5a68"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(clap::Subcommand)]
pub enum KeyCommand {
    /// List the key objects: name, Argon2id cost, and which one the
    /// current passphrase opens.
    List(RepoArgs),
    /// Add a passphrase that opens the repository.
    Add(AddArgs),
    /// Remove a key object: its passphrase no longer opens the repository.
    Remove(RemoveArgs),
}

#[derive(clap::Args)]
pub struct RepoArgs {
    /// Repository: a directory or s3://BUCKET/PREFIX.
    pub repo: RepoLocation,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct AddArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Read the new passphrase from FILE (less one trailing newline)
    /// instead of DEDUP_NEW_PASSWORD.
    #[arg(long, value_name = "FILE")]
    pub new_password_file: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The key's name, as `list` shows it (with or without `keys/`).
    pub key: String,
}

#[derive(Serialize)]
struct KeyJson {
    name: String,
    argon2id_memory_kib: u32,
    argon2id_passes: u32,
    argon2id_lanes: u32,
    current: bool,
}

#[derive(Serialize)]
struct ChangeJson {
    repository: String,
    added: Option<String>,
    removed: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.command {
        KeyCommand::List(a) => list(a),
        KeyCommand::Add(a) => add(a),
        KeyCommand::Remove(a) => remove(a),
    }
}

fn list(a: RepoArgs) -> anyhow::Result<ExitCode> {
    let repo = Repository::open_read_only(&a.repo)?;
    let keys: Vec<KeyJson> = (repo.list_keys()?.into_iter())
        .map(|k| KeyJson {
            name: k.name,
            argon2id_memory_kib: k.params.memory_kib,
            argon2id_passes: k.params.passes,
            argon2id_lanes: k.params.lanes,
            current: k.current,
        })
        .collect();
    if a.json {
        print_json(&keys)?;
    } else {
        for k in &keys {
            outln!(
                "{}  Argon2id {} MiB x {} passes{}",
                k.name,
                k.argon2id_memory_kib / 1024,
                k.argon2id_passes,
                if k.current { "  (this passphrase)" } else { "" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn new_passphrase(file: Option<&PathBuf>) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    let mut bytes = match file {
        Some(path) => Zeroizing::new(
            std::fs::read(path)
                .with_context(|| format!("reading the new passphrase from {}", path.display()))?,
        ),
        None => match std::env::var_os("DEDUP_NEW_PASSWORD") {
            Some(p) => Zeroizing::new(std::os::unix::ffi::OsStringExt::into_vec(p)),
            None => bail!(
                "give the new passphrase in DEDUP_NEW_PASSWORD or with --new-password-file FILE"
            ),
        },
    };
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    Ok(bytes)
}

fn add(a: AddArgs) -> anyhow::Result<ExitCode> {
    let passphrase = new_passphrase(a.new_password_file.as_ref())?;
    let repo = Repository::open_read_only(&a.repo.repo)?;
    let name = repo.add_key(&passphrase, KdfParams::DEFAULT)?;
    report(&a.repo, Some(name), None)
}

fn remove(a: RemoveArgs) -> anyhow::Result<ExitCode> {
    let repo = Repository::open_read_only(&a.repo.repo)?;
    repo.remove_key(&a.key)?;
    report(&a.repo, None, Some(a.key))
}

fn report(
    a: &RepoArgs,
    added: Option<String>,
    removed: Option<String>,
) -> anyhow::Result<ExitCode> {
    if a.json {
        print_json(&ChangeJson {
            repository: a.repo.to_string(),
            added,
            removed,
        })?;
    } else if let Some(name) = added {
        outln!("Added key {name} to {}.", a.repo);
    } else if let Some(name) = removed {
        outln!(
            "Removed key {name} from {}: its passphrase no longer opens it.",
            a.repo
        );
    }
    Ok(ExitCode::SUCCESS)
}
