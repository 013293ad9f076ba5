//! A sealed object: an object's bytes in frames of 64 KiB, each encrypted
//! and authenticated on its own (XChaCha20-Poly1305), so that a ranged
//! read decrypts only the frames it touches, as a restore reads one
//! compression frame of a container, and a damaged byte costs one frame's
//! read, named.
//!
//! ```text
//! frame i:  nonce (24 random bytes) | ciphertext (64 KiB, the last 0..=64 KiB) | tag (16)
//! ```
//!
//! A nonce is random per frame: 192 bits never repeat by chance, so no
//! counter has to survive a crash or be shared between writers. The
//! associated data binds each frame to the object's name, its index and
//! whether it is the last, so frames cannot be reordered, dropped from the
//! end, or moved to another object, and a whole object cannot be passed
//! off under another name. An empty object is one empty frame.

use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};

use crate::error::{Error, Result};

/// Plain bytes per frame.
pub const FRAME: u64 = 64 * 1024;
const NONCE: u64 = 24;
const TAG: u64 = 16;
/// What sealing adds to each frame.
pub const OVERHEAD: u64 = NONCE + TAG;
/// A full frame, sealed.
pub const SEALED_FRAME: u64 = FRAME + OVERHEAD;

/// What separates these frames' associated data from any other use of
/// the key.
const DOMAIN: &[u8] = b"dedup-store sealed object v1\0";

/// The key every object of a repository is sealed with.
pub struct ObjectKey(XChaCha20Poly1305);

impl ObjectKey {
    pub fn new(key: &[u8; 32]) -> ObjectKey {
        ObjectKey(XChaCha20Poly1305::new(&Key::from(*key)))
    }
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
    let layout = Layout::of_plain(plain.len() as u64);
    let mut nonces = vec![0u8; (layout.frames * NONCE) as usize];
    getrandom::fill(&mut nonces)
        .map_err(|e| Error::io(format!("drawing nonces to seal object {name}"), e.into()))?;
    let mut out = Vec::with_capacity(layout.sealed as usize);
    for i in 0..layout.frames {
        let from = (i * FRAME) as usize;
        let to = (from + FRAME as usize).min(plain.len());
        let nonce = &nonces[(i * NONCE) as usize..][..NONCE as usize];
        out.extend_from_slice(nonce);
        let at = out.len();
        out.extend_from_slice(&plain[from..to]);
        let ad = associated_data(name, i, i + 1 == layout.frames);
        let nonce = XNonce::try_from(nonce).expect("24 bytes");
        let tag = (key.0)
            .encrypt_inout_detached(&nonce, &ad, (&mut out[at..]).into())
            .map_err(|_| Error::InvalidArgument(format!("object {name} is too large to seal")))?;
        out.extend_from_slice(&tag);
    }
    Ok(out)
}

/// The plain bytes of frames `first..` of a sealed object of `layout`,
/// given its sealed bytes from frame `first`'s start (to the end, or to
/// the end of some frame).
pub fn open(
    key: &ObjectKey,
    name: &str,
    layout: Layout,
    first: u64,
    mut sealed: &[u8],
) -> Result<Vec<u8>> {
    let mut plain = Vec::with_capacity(sealed.len());
    let mut i = first;
    while !sealed.is_empty() {
        let len = layout.frame_len(i) as usize;
        if i >= layout.frames || sealed.len() < len {
            return Err(Error::corrupt(
                name,
                format!("sealed frame {i} of {} is cut short", layout.frames),
            ));
        }
        let (frame, rest) = sealed.split_at(len);
        let (nonce, body) = frame.split_at(NONCE as usize);
        let (body, tag) = body.split_at(body.len() - TAG as usize);
        let at = plain.len();
        plain.extend_from_slice(body);
        let nonce = XNonce::try_from(nonce).expect("24 bytes");
        let tag = Tag::try_from(tag).expect("16 bytes");
        let ad = associated_data(name, i, i + 1 == layout.frames);
        (key.0)
            .decrypt_inout_detached(&nonce, &ad, (&mut plain[at..]).into(), &tag)
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
        sealed = rest;
        i += 1;
    }
    Ok(plain)
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
            open(&key(1), "containers/01", layout, 0, &sealed).unwrap(),
            plain
        );
        let from2 = &sealed[2 * SEALED_FRAME as usize..];
        assert_eq!(
            open(&key(1), "containers/01", layout, 2, from2).unwrap(),
            &plain[2 * FRAME as usize..]
        );
        let empty = seal(&key(1), "x", b"").unwrap();
        assert_eq!(empty.len() as u64, OVERHEAD);
        let l = Layout::of_sealed(OVERHEAD).unwrap();
        assert_eq!(open(&key(1), "x", l, 0, &empty).unwrap(), b"");
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
            let e = open(&key(1), "recipes/a", layout, 0, &bad).unwrap_err();
            assert!(e.to_string().contains("recipes/a"), "{e}");
        }
        assert!(open(&key(2), "recipes/a", layout, 0, &sealed).is_err());
        assert!(open(&key(1), "recipes/b", layout, 0, &sealed).is_err());
        // The first frame alone, passed off as the whole object: not last.
        let cut = &sealed[..SEALED_FRAME as usize];
        let short = Layout::of_sealed(cut.len() as u64).unwrap();
        assert!(open(&key(1), "recipes/a", short, 0, cut).is_err());
        // Frames swapped.
        let two = seal(&key(1), "y", &vec![1u8; 2 * FRAME as usize]).unwrap();
        let mut swapped = two[SEALED_FRAME as usize..].to_vec();
        swapped.extend_from_slice(&two[..SEALED_FRAME as usize]);
        let l = Layout::of_sealed(swapped.len() as u64).unwrap();
        assert!(open(&key(1), "y", l, 0, &swapped).is_err());
    }
}
