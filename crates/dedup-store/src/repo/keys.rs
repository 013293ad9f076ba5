//! An encrypted repository's keys: opening it with a passphrase (each key
//! object tried in turn), and adding, listing and removing passphrases.
//! The objects themselves are `crypto::keys`.

use std::sync::Arc;

use super::Repository;
use crate::config::{KeyedOf, RepoConfig, CONFIG_OBJECT};
use crate::crypto::keys::{params_of, unwrap, wrap, KdfParams, MasterKey, KEYS_PREFIX};
use crate::crypto::random::random_bytes;
use crate::crypto::{passphrase, SealedStore};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo_location::RepoLocation;

/// What opened an encrypted repository.
pub(crate) struct Unlocked {
    master: MasterKey,
    /// The key object whose passphrase was given.
    key: String,
    /// The store below the sealing, where key objects are kept in the
    /// clear.
    clear: Arc<dyn ObjectStore>,
}

/// A key object of a repository, as `store key list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    pub name: String,
    pub params: KdfParams,
    /// The passphrase given opens this one.
    pub current: bool,
}

/// A fresh key object's name: `keys/` and 16 random hex digits.
pub(crate) fn new_key_name() -> RepoResult<String> {
    let id = u64::from_le_bytes(random_bytes()?);
    Ok(format!("{KEYS_PREFIX}{id:016x}"))
}

/// What `objects_of` opens: the store, what unlocked it, the config's
/// plain bytes.
pub(crate) type Objects = (Arc<dyn ObjectStore>, Option<Unlocked>, Vec<u8>);

/// The repository's objects as its readers see them, and its config's
/// plain bytes, given the `config` object as stored: `store` itself if
/// the config is in the clear, sealed under the master key the
/// passphrase unwraps if not.
///
/// Refused: a config in the clear beside key objects (the sealed config
/// may have been replaced, to have new backups written unsealed), and an
/// open `to_write` of a repository in the clear while a passphrase is
/// given (whoever can write the bucket could replace an encrypted
/// repository with one in the clear, and a backup run with its
/// passphrase must not then write file names and contents unsealed).
pub(crate) fn objects_of(
    location: &RepoLocation,
    store: Arc<dyn ObjectStore>,
    config: Vec<u8>,
    to_write: bool,
) -> RepoResult<Objects> {
    let refuse = |detail: &str| RepoError::NotARepository {
        repo: location.to_string(),
        detail: detail.into(),
    };
    if !RepoConfig::is_in_the_clear(&config) {
        let (sealed, unlocked, config) = unlock(location, store, config)?;
        return Ok((Arc::new(sealed), Some(unlocked), config));
    }
    if !store.list(KEYS_PREFIX)?.is_empty() {
        return Err(refuse(
            "its config is in the clear, yet it holds key objects (keys/): the config of an \
             encrypted repository may have been replaced; refusing it",
        ));
    }
    if to_write && passphrase::given()?.is_some() {
        return Err(refuse(
            "a passphrase was given, but the repository is not encrypted: refusing to write to \
             it in the clear (it may have been replaced). To use a repository in the clear, \
             unset DEDUP_PASSWORD and DEDUP_PASSWORD_FILE and give no --password-file",
        ));
    }
    Ok((store, None, config))
}

/// Open the encrypted repository in `store`, whose sealed `config` was
/// read already, with the passphrase given: the first key object it
/// opens whose master key also opens that config (a key object left by a
/// failed init, or put there by someone else, opens nothing); the config
/// is opened in memory, not read again. A damaged key object costs only
/// itself, unless no other opens.
fn unlock(
    location: &RepoLocation,
    store: Arc<dyn ObjectStore>,
    config: Vec<u8>,
) -> RepoResult<(SealedStore, Unlocked, Vec<u8>)> {
    let repo = location.to_string();
    let names = store.list(KEYS_PREFIX)?;
    if names.is_empty() {
        return Err(RepoError::NotARepository {
            repo,
            detail: "its config is neither a dedup config in the clear nor sealed with a key \
                     the repository holds (it has no key objects under keys/)"
                .into(),
        });
    }
    let given = passphrase::required(&repo)?;
    let mut damaged = None;
    for name in &names {
        let opened = store
            .get(name)
            .map_err(RepoError::from)
            .and_then(|bytes| unwrap(name, &bytes, &given));
        match opened {
            Ok(Some(master)) => {
                let sealed = SealedStore::new(store.clone(), &master, KeyedOf::Bytes);
                match sealed.open_whole(CONFIG_OBJECT, config.clone()) {
                    Ok(plain) => {
                        // Fingerprints as the config says: one that does
                        // not decode opens nothing (a check would else
                        // hash every segment the wrong way).
                        let keyed_of = RepoConfig::decode(&plain)
                            .map_err(|e| RepoError::NotARepository {
                                repo: repo.clone(),
                                detail: e.to_string(),
                            })?
                            .keyed_of;
                        let sealed = SealedStore::new(store.clone(), &master, keyed_of);
                        let key = name.clone();
                        let clear = store.clone();
                        return Ok((sealed, Unlocked { master, key, clear }, plain));
                    }
                    Err(e @ Error::Corrupt { .. }) => damaged = damaged.or(Some(e.into())),
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(None) => {}
            Err(e) => damaged = damaged.or(Some(e)),
        }
    }
    Err(damaged.unwrap_or(RepoError::WrongPassphrase {
        repo,
        keys: names.len(),
    }))
}

/// Set up an encrypted repository in the empty `store`: a new master
/// key, wrapped under the passphrase given, and `config` sealed under it.
/// The key object goes first (a config no key opens would be lost); if
/// the config cannot be put, the key object is taken back.
pub(crate) fn init_encrypted(
    location: &RepoLocation,
    store: Arc<dyn ObjectStore>,
    config: &RepoConfig,
    params: KdfParams,
) -> RepoResult<()> {
    let passphrase = passphrase::required(&location.to_string())?;
    if passphrase.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{location}: the passphrase is empty; an encrypted repository needs one \
             (DEDUP_PASSWORD, --password-file FILE or DEDUP_PASSWORD_FILE)"
        ))
        .into());
    }
    // `--force` over an existing repository must not leave a key object
    // beside a config it does not open.
    if store.size(CONFIG_OBJECT).is_ok() {
        return Err(Error::Exists {
            name: CONFIG_OBJECT.into(),
        }
        .into());
    }
    let master = MasterKey::random()?;
    let name = new_key_name()?;
    store.put(&name, &wrap(&name, &master, &passphrase, params)?)?;
    let sealed = SealedStore::new(store.clone(), &master, config.keyed_of);
    if let Err(e) = sealed.put(CONFIG_OBJECT, &config.encode()) {
        let _ = store.delete(&name);
        return Err(e.into());
    }
    Ok(())
}

impl Repository {
    fn unlocked(&self) -> RepoResult<&Unlocked> {
        self.unlocked.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: the repository is not encrypted, so it has no keys",
                self.location
            ))
            .into()
        })
    }

    /// Whether the repository is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.unlocked.is_some()
    }

    /// The repository's key objects.
    pub fn list_keys(&self) -> RepoResult<Vec<KeyInfo>> {
        let Unlocked {
            key: current,
            clear,
            ..
        } = self.unlocked()?;
        (clear.list(KEYS_PREFIX)?.into_iter())
            .map(|name| {
                let params = params_of(&name, &clear.get(&name)?)?;
                Ok(KeyInfo {
                    current: name == *current,
                    name,
                    params,
                })
            })
            .collect()
    }

    /// Let `passphrase` open the repository too; the new key object's name.
    pub fn add_key(&self, passphrase: &[u8], params: KdfParams) -> RepoResult<String> {
        let unlocked = self.unlocked()?;
        if passphrase.is_empty() {
            return Err(Error::InvalidArgument("the new passphrase is empty".into()).into());
        }
        let name = new_key_name()?;
        let object = wrap(&name, &unlocked.master, passphrase, params)?;
        unlocked.clear.put(&name, &object)?;
        Ok(name)
    }

    /// Remove key object `name`: its passphrase no longer opens the
    /// repository. Refused for the key that opened this handle, so the
    /// last key can never go and nobody locks themselves out by a typo.
    pub fn remove_key(&self, name: &str) -> RepoResult<()> {
        let unlocked = self.unlocked()?;
        let name = if name.starts_with(KEYS_PREFIX) {
            name.to_string()
        } else {
            format!("{KEYS_PREFIX}{name}")
        };
        if name == unlocked.key {
            return Err(Error::InvalidArgument(format!(
                "{name} is the key this passphrase opens; open the repository with \
                 another passphrase to remove it"
            ))
            .into());
        }
        unlocked.clear.size(&name)?; // NotFound names it; S3's delete would not
        unlocked.clear.delete(&name)?;
        Ok(())
    }
}

/// The objects of the repository at `location` as its readers see them
/// (`objects_of`), or as stored if it has no config, which the caller
/// reports. For a check, which reads objects without opening a
/// `Repository`.
pub fn open_objects(location: &RepoLocation) -> RepoResult<Arc<dyn ObjectStore>> {
    let store = location.open_store()?;
    match store.get(CONFIG_OBJECT) {
        Err(Error::NotFound { .. }) => Ok(store),
        Err(e) => Err(e.into()),
        Ok(raw) => objects_of(location, store, raw, false).map(|(objects, ..)| objects),
    }
}
