//! A sealed object: an object's bytes in frames of 64 KiB, each encrypted
//! and authenticated on its own (AES-256-GCM-SIV, RFC 8452, from aws-lc),
//! so that a ranged read decrypts only the frames it touches, as a
//! restore reads one compression frame of a container, and a damaged byte
//! costs one frame's read, named.
//!
//! ```text
//! frame i:  nonce (12 random bytes) | ciphertext (64 KiB, the last 0..=64 KiB) | tag (16)
//! ```
//!
//! A nonce is random per frame, so no counter has to survive a crash or be
//! shared between writers. GCM-SIV is why 96 random bits are enough: it
//! derives a key per nonce, so its bounds on random nonces reach far past
//! any repository's frames (2^48 and more under one key, where plain GCM
//! stops at 2^32), and even a repeated nonce would only show that two
//! frames are equal, never their bytes. On this project's machines it seals
//! 3.5 GB/s a core, against 1.35 GB/s for XChaCha20-Poly1305. The
//! associated data binds each frame to the object's name, its index and
//! whether it is the last, so frames cannot be reordered, dropped from the
//! end, or moved to another object, and a whole object cannot be passed
//! off under another name. An empty object is one empty frame.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM_SIV};

use crate::error::{Error, Result};

/// Plain bytes per frame.
pub const FRAME: u64 = 64 * 1024;
const NONCE: u64 = 12;
const TAG: u64 = 16;
/// What sealing adds to each frame.
pub const OVERHEAD: u64 = NONCE + TAG;
/// A full frame, sealed.
pub const SEALED_FRAME: u64 = FRAME + OVERHEAD;

/// What separates these frames' associated data from any other use of
/// the key.
const DOMAIN: &[u8] = b"dedup-store sealed object v1\0";

/// The key every object of a repository is sealed with.
pub struct ObjectKey(LessSafeKey);

impl ObjectKey {
    pub fn new(key: &[u8; 32]) -> ObjectKey {
        let key = UnboundKey::new(&AES_256_GCM_SIV, key).expect("a 32-byte AES-256 key");
        ObjectKey(LessSafeKey::new(key))
    }
}

/// The nonce at the start of `bytes`.
fn nonce(bytes: &[u8]) -> Nonce {
    Nonce::try_assume_unique_for_key(&bytes[..NONCE as usize]).expect("12 bytes")
}

/// The shape of a sealed object of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub frames: u64,
    pub plain: u64,
    pub sealed: u64,
}

impl Layout {
    /// The layout of `plain` bytes, sealed.
    pub fn of_plain(plain: u64) -> Layout {
        let frames = plain.div_ceil(FRAME).max(1);
        Layout {
            frames,
            plain,
            sealed: plain + frames * OVERHEAD,
        }
    }

    /// The layout of a sealed object of `sealed` bytes, or `None` if no
    /// sealed object is that long (its last frame would be shorter than a
    /// nonce and a tag).
    pub fn of_sealed(sealed: u64) -> Option<Layout> {
        let frames = sealed.div_ceil(SEALED_FRAME).max(1);
        let last = sealed.checked_sub((frames - 1) * SEALED_FRAME)?;
        (last >= OVERHEAD).then_some(Layout {
            frames,
            plain: sealed - frames * OVERHEAD,
            sealed,
        })
    }

    /// The plain size a listing reports for an object of `sealed` bytes:
    /// exact for a sealed object, a guess for a damaged one (whose read
    /// then fails, naming it).
    pub fn plain_size(sealed: u64) -> u64 {
        Layout::of_sealed(sealed).map_or(sealed, |l| l.plain)
    }

    /// Sealed bytes of frame `i`.
    fn frame_len(&self, i: u64) -> u64 {
        if i + 1 < self.frames {
            SEALED_FRAME
        } else {
            self.sealed - (self.frames - 1) * SEALED_FRAME
        }
    }
}

fn associated_data(name: &str, index: u64, last: bool) -> Vec<u8> {
    let mut ad = Vec::with_capacity(DOMAIN.len() + name.len() + 10);
    ad.extend_from_slice(DOMAIN);
    ad.extend_from_slice(name.as_bytes());
    ad.push(0);
    ad.extend_from_slice(&index.to_le_bytes());
    ad.push(last as u8);
    ad
}

/// `plain` sealed as the object `name`.
pub fn seal(key: &ObjectKey, name: &str, plain: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    seal_into(key, name, plain, &mut out)?;
    Ok(out)
}

/// `seal` into `out` (emptied first), whose memory a caller may reuse:
/// a fresh 16 MiB buffer per container is 4,096 pages the kernel must
/// fault in and zero each time.
pub fn seal_into(key: &ObjectKey, name: &str, plain: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let layout = Layout::of_plain(plain.len() as u64);
    let mut nonces = vec![0u8; (layout.frames * NONCE) as usize];
    getrandom::fill(&mut nonces)
        .map_err(|e| Error::io(format!("drawing nonces to seal object {name}"), e.into()))?;
    out.clear();
    out.reserve(layout.sealed as usize);
    for i in 0..layout.frames {
        let from = (i * FRAME) as usize;
        let to = (from + FRAME as usize).min(plain.len());
        let nonce_bytes = &nonces[(i * NONCE) as usize..][..NONCE as usize];
        out.extend_from_slice(nonce_bytes);
        let at = out.len();
        out.extend_from_slice(&plain[from..to]);
        let ad = associated_data(name, i, i + 1 == layout.frames);
        let tag = (key.0)
            .seal_in_place_separate_tag(nonce(nonce_bytes), Aad::from(&ad), &mut out[at..])
            .map_err(|_| Error::InvalidArgument(format!("object {name} is too large to seal")))?;
        out.extend_from_slice(tag.as_ref());
    }
    Ok(())
}

/// The plain bytes of frames `first..` of a sealed object of `layout`,
/// given its sealed bytes from frame `first`'s start (to the end, or to
/// the end of some frame) at `sealed[skip..]`. Opened in place: each frame
/// is decrypted where it lies and moved down over the nonces and tags
/// before it, so a restore's megabytes are not copied into a second
/// buffer (fresh pages cost the kernel more than the cipher costs).
pub fn open(
    key: &ObjectKey,
    name: &str,
    layout: Layout,
    first: u64,
    mut sealed: Vec<u8>,
    skip: usize,
) -> Result<Vec<u8>> {
    let (mut at, mut to) = (skip.min(sealed.len()), 0usize);
    let mut i = first;
    while at < sealed.len() {
        let len = layout.frame_len(i) as usize;
        if i >= layout.frames || sealed.len() - at < len {
            return Err(Error::corrupt(
                name,
                format!("sealed frame {i} of {} is cut short", layout.frames),
            ));
        }
        let body = at + NONCE as usize..at + len - TAG as usize;
        let ad = associated_data(name, i, i + 1 == layout.frames);
        let (head, rest) = sealed.split_at_mut(body.start);
        let (cipher, tail) = rest.split_at_mut(body.len());
        (key.0)
            .open_in_place_separate_tag(
                nonce(&head[at..]),
                Aad::from(&ad),
                &tail[..TAG as usize],
                cipher,
            )
            .map_err(|_| {
                Error::corrupt(
                    name,
                    format!(
                        "sealed frame {i} of {} fails its authentication tag: \
                         the object is damaged, was sealed with another key, or was \
                         moved from another name",
                        layout.frames
                    ),
                )
            })?;
        sealed.copy_within(body.clone(), to);
        to += body.len();
        at += len;
        i += 1;
    }
    sealed.truncate(to);
    Ok(sealed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ObjectKey {
        ObjectKey::new(&[b; 32])
    }

    #[test]
    fn layouts_of_plain_and_sealed_sizes_agree() {
        let f = FRAME;
        for plain in [0, 1, 39, 40, f - 1, f, f + 1, 2 * f, 3 * f - 7, 16 << 20] {
            let l = Layout::of_plain(plain);
            assert_eq!(Layout::of_sealed(l.sealed), Some(l), "{plain}");
        }
        // A last frame shorter than a nonce and a tag is no sealed object.
        for sealed in [
            0,
            1,
            OVERHEAD - 1,
            SEALED_FRAME + 1,
            SEALED_FRAME + OVERHEAD - 1,
        ] {
            assert_eq!(Layout::of_sealed(sealed), None, "{sealed}");
        }
    }

    #[test]
    fn sealed_objects_open_whole_and_by_frame() {
        let plain: Vec<u8> = (0..3 * FRAME as usize + 100)
            .map(|i| (i * 7) as u8)
            .collect();
        let sealed = seal(&key(1), "containers/01", &plain).unwrap();
        let layout = Layout::of_sealed(sealed.len() as u64).unwrap();
        assert_eq!(layout.frames, 4);
        assert_eq!(
            open(&key(1), "containers/01", layout, 0, sealed.clone(), 0).unwrap(),
            plain
        );
        let from2 = 2 * SEALED_FRAME as usize;
        assert_eq!(
            open(&key(1), "containers/01", layout, 2, sealed.clone(), from2).unwrap(),
            &plain[2 * FRAME as usize..]
        );
        let empty = seal(&key(1), "x", b"").unwrap();
        assert_eq!(empty.len() as u64, OVERHEAD);
        let l = Layout::of_sealed(OVERHEAD).unwrap();
        assert_eq!(open(&key(1), "x", l, 0, empty, 0).unwrap(), b"");
    }

    #[test]
    fn no_plain_byte_shows_and_two_seals_differ() {
        let plain = vec![b'A'; 1000];
        let a = seal(&key(1), "x", &plain).unwrap();
        let b = seal(&key(1), "x", &plain).unwrap();
        assert_ne!(a, b, "random nonces");
        assert!(!a.windows(8).any(|w| w == b"AAAAAAAA"));
    }

    #[test]
    fn every_flipped_byte_another_key_name_or_cut_is_refused_by_name() {
        let plain: Vec<u8> = (0..FRAME as usize + 500).map(|i| i as u8).collect();
        let sealed = seal(&key(1), "recipes/a", &plain).unwrap();
        let layout = Layout::of_sealed(sealed.len() as u64).unwrap();
        for at in (0..sealed.len()).step_by(97).chain([0, sealed.len() - 1]) {
            let mut bad = sealed.clone();
            bad[at] ^= 0x20;
            let e = open(&key(1), "recipes/a", layout, 0, bad, 0).unwrap_err();
            assert!(e.to_string().contains("recipes/a"), "{e}");
        }
        assert!(open(&key(2), "recipes/a", layout, 0, sealed.clone(), 0).is_err());
        assert!(open(&key(1), "recipes/b", layout, 0, sealed.clone(), 0).is_err());
        // The first frame alone, passed off as the whole object: not last.
        let cut = &sealed[..SEALED_FRAME as usize];
        let short = Layout::of_sealed(cut.len() as u64).unwrap();
        assert!(open(&key(1), "recipes/a", short, 0, cut.to_vec(), 0).is_err());
        // Frames swapped.
        let two = seal(&key(1), "y", &vec![1u8; 2 * FRAME as usize]).unwrap();
        let mut swapped = two[SEALED_FRAME as usize..].to_vec();
        swapped.extend_from_slice(&two[..SEALED_FRAME as usize]);
        let l = Layout::of_sealed(swapped.len() as u64).unwrap();
        assert!(open(&key(1), "y", l, 0, swapped, 0).is_err());
    }
}
