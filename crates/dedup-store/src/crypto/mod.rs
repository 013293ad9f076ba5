//! Encryption at rest (issue 38): every object of an encrypted repository
//! sealed with authenticated encryption under a repository key
//! (`sealed.rs`, `sealed_store.rs`), the key wrapped under passphrases
//! (`keys.rs`, `passphrase.rs`), and the segments' fingerprints keyed so
//! that they reveal nothing about the bytes. The primitives are the
//! AES-256-GCM-SIV of aws-lc (through aws-lc-rs, as rustls uses it), the
//! RustCrypto crate's Argon2id and BLAKE3's keyed
//! mode and key derivation; nothing here is a cipher of our own.

pub mod keys;
pub mod passphrase;
pub mod random;
pub mod sealed;
pub mod sealed_store;

pub use keys::{KdfParams, MasterKey, KEYS_PREFIX};
pub use sealed::ObjectKey;
pub use sealed_store::SealedStore;
