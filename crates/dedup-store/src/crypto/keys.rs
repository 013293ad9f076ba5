//! Key objects (`keys/<id>`): the repository's master key, wrapped by a
//! key derived from a passphrase with Argon2id (memory-hard, RFC 9106),
//! one object per passphrase, so several passphrases open one repository
//! and one can be removed without re-encrypting anything.
//!
//! The master key is 32 random bytes drawn at `init`. From it come, by
//! BLAKE3's key derivation, the key every object is sealed with and the
//! key of the segments' fingerprints (keyed BLAKE3): so a reader of the
//! bucket learns nothing from a fingerprint, while every writer that
//! holds the master key fingerprints the same bytes the same way and
//! deduplicates against all the others.
//!
//! A key object is the one object stored in the clear, since it is read
//! before any key is known; it holds the KDF's parameters, a random salt
//! and the wrapped master key. The parameters and salt are the wrap's
//! associated data, so changing them fails the wrap's tag.

use argon2::{Algorithm, Argon2, Params, Version};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM_SIV};
use zeroize::Zeroizing;

use super::sealed::ObjectKey;
use crate::crypto::random::random_bytes;
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::framed::{frame, unframe, Reader};

pub const KEYS_PREFIX: &str = "keys/";
const MAGIC: [u8; 8] = *b"DDUPKEY_";
const VERSION: u32 = 1;
/// Argon2id, version 0x13: the only KDF a key object names so far.
const KDF_ARGON2ID: u32 = 1;

/// Argon2id's cost: memory in KiB, passes, lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    pub memory_kib: u32,
    pub passes: u32,
    pub lanes: u32,
}

impl KdfParams {
    /// 64 MiB and 3 passes: about 0.2 s on this project's machines, and
    /// RFC 9106's second recommended setting.
    pub const DEFAULT: KdfParams = KdfParams {
        memory_kib: 64 * 1024,
        passes: 3,
        lanes: 1,
    };

    /// The cheapest Argon2id allows: for tests that open many
    /// repositories. Never for a repository anyone keeps.
    #[doc(hidden)]
    pub const FOR_TESTS: KdfParams = KdfParams {
        memory_kib: 8,
        passes: 1,
        lanes: 1,
    };

    /// A key object asking for more than 4 GiB or 100 passes is refused
    /// rather than obeyed: a damaged or hostile object must not exhaust
    /// the machine.
    fn check(self, object: &str) -> RepoResult<Params> {
        if self.memory_kib > 4 << 20 || self.passes > 100 || self.lanes > 64 {
            return Err(RepoError::corrupt(
                object,
                format!("its key derivation asks for too much: {self:?}"),
            ));
        }
        Params::new(self.memory_kib, self.passes, self.lanes, Some(32)).map_err(|e| {
            RepoError::corrupt(object, format!("its key derivation's parameters: {e}"))
        })
    }
}

/// The repository's master key; zeroed when dropped.
pub struct MasterKey(Zeroizing<[u8; 32]>);

impl MasterKey {
    pub fn random() -> RepoResult<MasterKey> {
        let mut key = Zeroizing::new([0u8; 32]);
        getrandom::fill(key.as_mut()).map_err(|e| RepoError::Io {
            context: "drawing a master key".into(),
            cause: e.into(),
        })?;
        Ok(MasterKey(key))
    }

    /// The key every object is sealed with.
    pub fn object_key(&self) -> ObjectKey {
        let key = Zeroizing::new(blake3::derive_key(
            "dedup-store 2026-11-29 object sealing key",
            self.0.as_ref(),
        ));
        ObjectKey::new(&key)
    }

    /// The key of the segments' keyed-BLAKE3 fingerprints.
    pub fn fingerprint_key(&self) -> [u8; 32] {
        blake3::derive_key(
            "dedup-store 2026-11-29 segment fingerprint key",
            self.0.as_ref(),
        )
    }
}

/// The header of a key object before its wrapped key (60 bytes): what the
/// wrap authenticates.
fn header(params: KdfParams, salt: &[u8; 32], nonce: &[u8; 12]) -> Vec<u8> {
    let mut h = Vec::with_capacity(72);
    for v in [KDF_ARGON2ID, params.memory_kib, params.passes, params.lanes] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(salt);
    h.extend_from_slice(nonce);
    h
}

fn key_from_passphrase(
    object: &str,
    passphrase: &[u8],
    params: KdfParams,
    salt: &[u8; 32],
) -> RepoResult<LessSafeKey> {
    let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.check(object)?);
    let mut key = Zeroizing::new([0u8; 32]);
    argon
        .hash_password_into(passphrase, salt, key.as_mut())
        .map_err(|e| Error::InvalidArgument(format!("deriving a key from the passphrase: {e}")))?;
    let key = UnboundKey::new(&AES_256_GCM_SIV, key.as_ref()).expect("a 32-byte AES-256 key");
    Ok(LessSafeKey::new(key))
}

/// The key object `object` for `master` under `passphrase`.
pub fn wrap(
    object: &str,
    master: &MasterKey,
    passphrase: &[u8],
    params: KdfParams,
) -> RepoResult<Vec<u8>> {
    // Not secret: the repository's own source of random bytes. (The
    // master key is drawn into zeroed-on-drop memory instead.)
    let (salt, nonce) = (random_bytes::<32>()?, random_bytes::<12>()?);
    let kek = key_from_passphrase(object, passphrase, params, &salt)?;
    let mut body = header(params, &salt, &nonce);
    let at = body.len();
    body.extend_from_slice(master.0.as_ref());
    let (authenticated, key) = body.split_at_mut(at);
    let tag = kek
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(authenticated),
            key,
        )
        .map_err(|_| Error::InvalidArgument("wrapping the master key".into()))?;
    body.extend_from_slice(tag.as_ref());
    Ok(frame(MAGIC, VERSION, &body))
}

/// The KDF parameters a key object names.
pub fn params_of(object: &str, bytes: &[u8]) -> RepoResult<KdfParams> {
    Ok(parse(object, bytes)?.params)
}

struct Parsed<'a> {
    params: KdfParams,
    salt: [u8; 32],
    authenticated: &'a [u8],
    nonce: [u8; 12],
    wrapped: &'a [u8],
    tag: &'a [u8],
}

fn parse<'a>(object: &'a str, bytes: &'a [u8]) -> RepoResult<Parsed<'a>> {
    let body = unframe(object, MAGIC, VERSION, bytes)?;
    let mut r = Reader::new(object, body);
    let kdf = r.u32()?;
    if kdf != KDF_ARGON2ID {
        return Err(RepoError::corrupt(
            object,
            format!("key derivation {kdf} is not one this version knows (1: Argon2id)"),
        ));
    }
    let params = KdfParams {
        memory_kib: r.u32()?,
        passes: r.u32()?,
        lanes: r.u32()?,
    };
    let salt = r.bytes(32)?.try_into().expect("32");
    let nonce = r.bytes(12)?.try_into().expect("12");
    let authenticated = &body[..60];
    let wrapped = r.bytes(32)?;
    let tag = r.bytes(16)?;
    r.finish()?;
    Ok(Parsed {
        params,
        salt,
        authenticated,
        nonce,
        wrapped,
        tag,
    })
}

/// The master key in key object `object`, if `passphrase` opens it;
/// `None` if it does not.
pub fn unwrap(object: &str, bytes: &[u8], passphrase: &[u8]) -> RepoResult<Option<MasterKey>> {
    let p = parse(object, bytes)?;
    let kek = key_from_passphrase(object, passphrase, p.params, &p.salt)?;
    let mut master = Zeroizing::new([0u8; 32]);
    master.copy_from_slice(p.wrapped);
    let opened = kek.open_in_place_separate_tag(
        Nonce::assume_unique_for_key(p.nonce),
        Aad::from(p.authenticated),
        p.tag,
        master.as_mut_slice(),
    );
    Ok(opened.is_ok().then_some(MasterKey(master)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_object_opens_with_its_passphrase_only() {
        let master = MasterKey::random().unwrap();
        let obj = wrap("keys/a", &master, b"right", KdfParams::FOR_TESTS).unwrap();
        let opened = unwrap("keys/a", &obj, b"right").unwrap().unwrap();
        assert_eq!(opened.0.as_ref(), master.0.as_ref());
        assert!(unwrap("keys/a", &obj, b"wrong").unwrap().is_none());
        assert_eq!(params_of("keys/a", &obj).unwrap(), KdfParams::FOR_TESTS);
        assert!(!obj.windows(32).any(|w| w == master.0.as_ref()));
    }

    #[test]
    fn damaged_or_hostile_key_objects_are_refused_by_name() {
        let master = MasterKey::random().unwrap();
        let obj = wrap("keys/a", &master, b"pw", KdfParams::FOR_TESTS).unwrap();
        for at in 0..obj.len() {
            let mut bad = obj.clone();
            bad[at] ^= 1;
            match unwrap("keys/a", &bad, b"pw") {
                Err(e) => assert!(e.to_string().contains("keys/a"), "{e}"),
                Ok(None) => {}
                Ok(Some(_)) => panic!("byte {at} flipped, yet the key opened"),
            }
        }
        // Parameters raised past the bound, with a fresh crc: refused
        // before any memory is asked for.
        let body_at = 12;
        let mut hostile = obj[..obj.len() - 4].to_vec();
        hostile[body_at + 4..body_at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let sum = crc32c::crc32c(&hostile);
        hostile.extend_from_slice(&sum.to_le_bytes());
        let e = unwrap("keys/a", &hostile, b"pw").err().expect("refused");
        assert!(e.to_string().contains("too much"), "{e}");
    }
}
