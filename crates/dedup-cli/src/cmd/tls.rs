//! `dedup tls-psk FILE`: make a TLS pre-shared key file for `dedup serve
//! --tls-psk FILE` and for its clients, in the format nbdkit (through
//! GnuTLS) and libnbd both read: one `USERNAME:HEXKEY` line per user.
//! Reading such a file back is `shared/psk.rs`'s.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};

/// 256 bits, as GnuTLS's psktool makes by default.
const KEY_BYTES: usize = 32;
/// Usernames travel in URIs (`nbds://USER@host`) and in the file before a
/// colon: keeping to these characters needs no escaping anywhere.
const MAX_USERNAME: usize = 64;

#[derive(clap::Args)]
#[command(
    about = "Make a pre-shared key (PSK) file: for TLS on `dedup serve --tls-psk FILE`, and for `dedup store serve --psk FILE` and its clients",
    after_help = "Examples:\n  dedup tls-psk ./dev.psk\n  dedup serve ./dev --tls require --tls-psk ./dev.psk\n  nbdinfo 'nbds+unix://dedup@/?socket=./dev/nbd.sock&tls-psk-file=./dev.psk'\n\nThe file holds one line, USERNAME:KEY (32 random bytes from the kernel, in hex), and is created 0600. Whoever holds a copy can read and overwrite the device (or, for a backup server, restore, add and delete its backups): hand it to clients over a channel you trust (scp, a secrets store), never by plain e-mail or chat.\n\nA backup server:\n  dedup tls-psk ./backup.psk\n  dedup store serve ./repo --listen 127.0.0.1:7070 --psk ./backup.psk\n  dedup backup --server tcp:127.0.0.1:7070 --psk ./backup.psk NAME DIR"
)]
pub struct Args {
    /// The key file to write (created readable by you alone).
    pub file: PathBuf,
    /// The username clients authenticate as: letters, digits, '.', '_', '-'.
    #[arg(long, default_value = "dedup", value_parser = username_arg)]
    pub user: String,
    /// Replace FILE if it exists (clients holding the old key are then refused).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let key = random_key()?;
    write_psk_file(&a.file, &a.user, &key, a.force)?;
    let file = std::path::absolute(&a.file).unwrap_or_else(|_| a.file.clone());
    outln!(
        "Wrote a TLS pre-shared key for user {} to {} (mode 0600).",
        a.user,
        file.display()
    );
    outln!(
        "Serve with:  dedup serve DIR --tls require --tls-psk {}",
        file.display()
    );
    outln!(
        "Clients need a copy of the file (keep it 0600) and name it in the URI, e.g.\n  nbdinfo 'nbds+unix://{}@/?socket=DIR/nbd.sock&tls-psk-file={}'",
        a.user,
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// clap value parser for `--user`.
pub fn username_arg(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= MAX_USERNAME
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a usable PSK username: use 1 to {MAX_USERNAME} letters, digits, '.', '_' or '-' \
             (it is written as USERNAME:KEY and sent in URIs as USERNAME@)"
        ))
    }
}

/// Random bytes from the kernel's CSPRNG (getrandom(2), which waits until
/// the pool is seeded at boot and never after).
fn random_key() -> anyhow::Result<[u8; KEY_BYTES]> {
    let mut key = [0u8; KEY_BYTES];
    let mut filled = 0;
    while filled < KEY_BYTES {
        let rest = &mut key[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("reading random bytes from the kernel (getrandom)");
        }
        filled += n as usize;
    }
    Ok(key)
}

fn psk_line(user: &str, key: &[u8]) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("{user}:{hex}\n")
}

/// Write the file beside its final path and move it there: FILE is never
/// seen half-written, and is 0600 from the moment it exists (tempfile
/// creates it so). Without `force` an existing FILE is never replaced,
/// even one that appears while we write.
fn write_psk_file(path: &Path, user: &str, key: &[u8], force: bool) -> anyhow::Result<()> {
    if !force && fs::symlink_metadata(path).is_ok() {
        bail!(
            "{} exists: pass --force to replace it (clients holding the old key will be refused), or pick another file",
            path.display()
        );
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".dedup-psk-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(dedup_core::perms::FILE_MODE))
        .context("making the key file private to its owner")?;
    tmp.write_all(psk_line(user, key).as_bytes())
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing the key to {}", tmp.path().display()))?;
    let placed = if force {
        tmp.persist(path).map(|_| ())
    } else {
        tmp.persist_noclobber(path).map(|_| ())
    };
    placed.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow!(
                "{} appeared while the key was written: pass --force to replace it",
                path.display()
            )
        } else {
            anyhow!("placing the key file at {}: {}", path.display(), e.error)
        }
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::super::shared::psk::{psk_secret, psk_username};
    use super::*;

    #[test]
    fn a_key_file_is_one_line_of_user_and_64_hex_digits_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k.psk");
        let key = random_key().unwrap();
        write_psk_file(&path, "alice", &key, false).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let (user, hex) = text.trim_end().split_once(':').unwrap();
        assert_eq!(user, "alice");
        assert_eq!(hex.len(), 2 * KEY_BYTES);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(text.lines().count(), 1);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(psk_username(&path).unwrap(), "alice");
        assert_eq!(*psk_secret(&path).unwrap(), key);
        let leftovers = fs::read_dir(tmp.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file is left behind");
    }

    #[test]
    fn an_existing_file_is_replaced_only_with_force() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k.psk");
        fs::write(&path, "keep me").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = write_psk_file(&path, "u", &[1; KEY_BYTES], false).unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "keep me");
        write_psk_file(&path, "u", &[1; KEY_BYTES], true).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("u:{}\n", "01".repeat(KEY_BYTES))
        );
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    }

    #[test]
    fn two_keys_differ() {
        assert_ne!(random_key().unwrap(), random_key().unwrap());
    }

    #[test]
    fn usernames_that_would_need_escaping_are_refused() {
        assert!(username_arg("dedup").is_ok());
        assert!(username_arg("backup-host_1.example").is_ok());
        for bad in ["", "a:b", "a@b", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(username_arg(bad).is_err(), "{bad:?} accepted");
        }
    }
}
