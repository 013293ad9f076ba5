//! Mutual authentication of a connection by a shared key (the pre-shared
//! key of a `dedup tls-psk` file), so that on TCP, where every local user
//! can connect to a loopback port, only holders of the key reach the
//! repository, and a client only sends its data to a server that holds
//! the same key (not to another user's process that took the port first).
//!
//! Challenge and response, never the key itself: the server's `Hello`
//! answer carries a random challenge; the client answers with a random
//! nonce of its own and a proof, BLAKE3 keyed by the key over both; the
//! server checks it and answers with its own proof over both, which the
//! client checks. Both are fresh per connection, so a recorded proof is
//! worth nothing on another connection, and a proof from one side can
//! never be replayed as the other's (each names its side). Over TCP both
//! proofs also cover the TLS session's exported keying material
//! (`tls.rs`), which binds them to the one encrypted channel they were
//! made in: a man in the middle cannot relay them.

use zeroize::Zeroize;

/// The key both sides hold, derived from the secret in the key file (so a
/// secret of any length makes a 256-bit key used for nothing else). Its
/// bytes, and the keyed hasher's state after each proof, are overwritten
/// with zeros once done with, so they do not linger in freed memory (a
/// core dump, a swapped-out page).
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Drop for Key {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)") // never print the key
    }
}

/// Who makes a proof: part of what is hashed.
#[derive(Clone, Copy)]
enum Side {
    Client,
    Server,
}

impl Key {
    /// The key for `secret` (the bytes a PSK file holds in hex).
    pub fn derive(secret: &[u8]) -> Key {
        Key(blake3::derive_key(
            "dedup store server authentication 2026-11 v1",
            secret,
        ))
    }

    fn proof(&self, side: Side, p: &Proved) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(match side {
            Side::Client => b"client",
            Side::Server => b"server",
        });
        h.update(p.challenge);
        h.update(p.nonce);
        h.update(p.binding);
        let proof = h.finalize();
        h.zeroize();
        proof
    }

    /// The client's proof over `p`.
    pub fn client_proof(&self, p: &Proved) -> [u8; 32] {
        *self.proof(Side::Client, p).as_bytes()
    }

    /// The server's proof, given back once the client's is checked.
    pub fn server_proof(&self, p: &Proved) -> [u8; 32] {
        *self.proof(Side::Server, p).as_bytes()
    }

    /// Whether `proof` is the client's.
    pub fn is_client_proof(&self, p: &Proved, proof: &[u8; 32]) -> bool {
        self.holds(Side::Client, p, proof)
    }

    /// Whether `proof` is the server's.
    pub fn is_server_proof(&self, p: &Proved, proof: &[u8; 32]) -> bool {
        self.holds(Side::Server, p, proof)
    }

    /// `blake3::Hash` compares in constant time: a proof that fails
    /// tells nothing of how close it came.
    fn holds(&self, side: Side, p: &Proved, proof: &[u8; 32]) -> bool {
        self.proof(side, p) == blake3::Hash::from_bytes(*proof)
    }
}

/// What a proof covers: the server's challenge, the client's nonce, and
/// the TLS session's exported keying material (`tls::Binding`; zeros on
/// a Unix socket), so a proof made in one TLS session holds in no other
/// and a man in the middle, who runs two, is found.
pub struct Proved<'a> {
    pub challenge: &'a [u8; 32],
    pub nonce: &'a [u8; 32],
    pub binding: &'a [u8; 32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_hold_only_for_the_same_key_challenge_nonce_binding_and_side() {
        let (k, other) = (Key::derive(b"secret"), Key::derive(b"secreT"));
        let (c, n, b, three) = ([1u8; 32], [2u8; 32], [4u8; 32], [3u8; 32]);
        let at = |challenge, nonce, binding| Proved {
            challenge,
            nonce,
            binding,
        };
        let p = k.client_proof(&at(&c, &n, &b));
        assert!(k.is_client_proof(&at(&c, &n, &b), &p));
        assert!(!other.is_client_proof(&at(&c, &n, &b), &p), "another key");
        assert!(
            !k.is_client_proof(&at(&three, &n, &b), &p),
            "another challenge"
        );
        assert!(!k.is_client_proof(&at(&c, &three, &b), &p), "another nonce");
        assert!(
            !k.is_client_proof(&at(&c, &n, &three), &p),
            "another TLS session"
        );
        assert!(
            !k.is_server_proof(&at(&c, &n, &b), &p),
            "the client's proof is not the server's"
        );
        let s = k.server_proof(&at(&c, &n, &b));
        assert!(k.is_server_proof(&at(&c, &n, &b), &s));
        assert_ne!(p, s);
        assert_eq!(format!("{k:?}"), "Key(..)");
    }
}
