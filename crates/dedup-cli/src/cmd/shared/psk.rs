//! Pre-shared key files (`USERNAME:HEXKEY` lines, as `dedup tls-psk`
//! makes them) read back: the username `dedup serve --tls-psk` puts in its
//! URIs, and the key `dedup store serve --psk` and its clients prove they
//! share.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use dedup_store::rpc::Key;
use zeroize::Zeroizing;

/// The username of a PSK file's first entry (`USERNAME:HEXKEY`), refusing
/// anything else: a wrong file given to `--tls-psk` would otherwise only
/// show as every client failing its handshake.
pub fn psk_username(path: &Path) -> anyhow::Result<String> {
    psk_entry(path).map(|(user, _)| user)
}

/// The key of a PSK file's first entry, as bytes: the secret `dedup store
/// serve --psk` and its clients prove they share.
pub fn psk_secret(path: &Path) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    psk_entry(path).map(|(_, key)| key)
}

/// A PSK file's first entry: its username and its key's bytes.
fn psk_entry(path: &Path) -> anyhow::Result<(String, Zeroizing<Vec<u8>>)> {
    // The file's text and the key's bytes are zeroed when dropped.
    let text = Zeroizing::new(
        fs::read_to_string(path)
            .with_context(|| format!("reading the PSK file {}", path.display()))?,
    );
    let not_psk = || {
        anyhow!(
            "{} is not a PSK file (lines of USERNAME:HEXKEY): make one with `dedup tls-psk {}`",
            path.display(),
            path.display()
        )
    };
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(not_psk)?;
    let (user, hex) = line.split_once(':').ok_or_else(not_psk)?;
    let hex_ok =
        !hex.is_empty() && hex.len() % 2 == 0 && hex.chars().all(|c| c.is_ascii_hexdigit());
    if user.is_empty() || !hex_ok {
        return Err(not_psk());
    }
    let key = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| not_psk())?;
    Ok((user.to_string(), Zeroizing::new(key)))
}

/// Say so when a key file can be read by others: anyone who can read it can
/// read and overwrite the device.
pub fn warn_if_shared(path: &Path) {
    if let Ok(m) = fs::metadata(path) {
        if m.mode() & 0o077 != 0 {
            eprintln!(
                "dedup: warning: the PSK file {} can be read by other users (mode {:04o}): chmod 600 {}",
                path.display(),
                m.mode() & 0o7777,
                path.display()
            );
        }
    }
}

/// Fewest bytes of a key file's secret: less is guessable.
const MIN_SECRET: usize = 16;

/// The key of a PSK file (`--psk`), for a server or a client.
pub fn key_from_file(path: &Path) -> anyhow::Result<Key> {
    let secret = psk_secret(path)?;
    if secret.len() < MIN_SECRET {
        bail!(
            "the key in {} is {} bytes, too short to keep others out (at least {MIN_SECRET}): make one with `dedup tls-psk FILE`",
            path.display(),
            secret.len()
        );
    }
    warn_if_shared(path);
    Ok(Key::derive(&secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_psk_files_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x");
        for bad in [
            "",
            "\n\n",
            "justtext",
            "user:",
            ":abcd",
            "user:xyz1",
            "user:abc",
        ] {
            fs::write(&path, bad).unwrap();
            let err = psk_username(&path).unwrap_err().to_string();
            assert!(err.contains("dedup tls-psk"), "{bad:?}: {err}");
        }
        fs::write(&path, "\n  bob:00ff\nother:11\n").unwrap();
        assert_eq!(psk_username(&path).unwrap(), "bob");
    }
}
