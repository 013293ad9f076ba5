//! BLAKE3 of many short messages at once: the same hashes as
//! `blake3::hash` of each, in a fraction of the time for segments of a few
//! KiB.
//!
//! Why: BLAKE3 gets its speed by compressing many 1 KiB chunks side by
//! side (16 with AVX-512, 8 with AVX2). A content-defined segment averages
//! 8-11 KiB, so one message alone fills the lanes once at best; its last
//! full chunks, its partial chunk and most of its tree are compressed one
//! at a time. On the bench's first GiB cut by FastCDC (2/8/32 KiB, mean
//! 10.9 KiB), hashing segment by segment took 0.44 s, as long as the
//! 16-lane kernel takes for three GiB of one large input. Hashed 256 at a
//! time here: 0.25 s.
//!
//! How (the tree of the BLAKE3 paper, §2.1): a message of more than one
//! chunk is chunks, each compressed from the key with its index as the
//! counter, then parents, each the compression of two chaining values;
//! the tree is left-full, which is what pairing neighbours level by level,
//! carrying an odd last value up unpaired, builds. So the full chunks of
//! every message that have the same index go through one `hash_many` call
//! (same counter, same flags), the partial last chunks go one by one
//! through `hazmat` (a subtree at an offset), and the parents of every
//! message at one level go through one call; a message's last parent is
//! its root and gets the ROOT flag. A message of one chunk or less, or of
//! more than `MOST_CHUNKS`, is simply `blake3::hash`.
//!
//! `blake3::platform` is public but hidden ("for benchmarks only"), the
//! one way to reach the crate's SIMD kernels with many inputs. If a
//! release changes it, this stops compiling; if one changed its meaning,
//! the tests below (every length around chunk and tree boundaries, random
//! batches against `blake3::hash`) fail.

use blake3::hazmat::HasherExt;
use blake3::platform::Platform;
use blake3::IncrementCounter;

/// BLAKE3's chunk, the unit its SIMD kernels run side by side.
const CHUNK_LEN: usize = 1024;
const OUT_LEN: usize = blake3::OUT_LEN;

/// BLAKE3's IV, the key of the plain hash mode (the SHA-256 IV).
const IV: [u32; 8] = [
    0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19,
];
// Domain flags (BLAKE3 paper, Table 3).
const CHUNK_START: u8 = 1 << 0;
const CHUNK_END: u8 = 1 << 1;
const PARENT: u8 = 1 << 2;
const ROOT: u8 = 1 << 3;
const KEYED_HASH: u8 = 1 << 4;

type Cv = [u8; OUT_LEN];

/// Messages of more chunks than this are hashed alone: one fills the SIMD
/// lanes with its own chunks, where side by side with few others its
/// chunks of each index would go a handful at a time (a store of large
/// fixed segments sends a few to an append). FastCDC's largest segments
/// (4 times the average, 32 KiB by default) stay in the batch.
const MOST_CHUNKS: usize = 32;

/// `blake3::hash` of each message, in order.
pub fn hash_many(messages: &[&[u8]]) -> Vec<[u8; OUT_LEN]> {
    hash_many_with(None, messages)
}

/// `blake3::keyed_hash(key, m)` of each message `m`, in order.
pub fn keyed_hash_many(key: &[u8; 32], messages: &[&[u8]]) -> Vec<[u8; OUT_LEN]> {
    hash_many_with(Some(key), messages)
}

/// The keyed mode differs from the plain one only in the key words the
/// compressions start from (the key instead of the IV) and the
/// KEYED_HASH flag on every compression.
fn hash_many_with(key: Option<&[u8; 32]>, messages: &[&[u8]]) -> Vec<[u8; OUT_LEN]> {
    let platform = Platform::detect();
    let (words, mode) = match key {
        None => (IV, 0),
        Some(k) => {
            let mut w = [0u32; 8];
            for (w, b) in w.iter_mut().zip(k.chunks_exact(4)) {
                *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
            }
            (w, KEYED_HASH)
        }
    };
    let one = |m: &[u8]| match key {
        None => blake3::hash(m),
        Some(k) => blake3::keyed_hash(k, m),
    };
    let new_hasher = || match key {
        None => blake3::Hasher::new(),
        Some(k) => blake3::Hasher::new_keyed(k),
    };
    let mut out = vec![[0u8; OUT_LEN]; messages.len()];
    // Messages of more than one chunk, and their chaining values: a run
    // of `cvs` each, one a chunk to start with, fewer each level up.
    let mut long: Vec<Long> = Vec::new();
    let mut cvs: Vec<Cv> = Vec::new();
    let mut most_full = 0;
    for (i, m) in messages.iter().enumerate() {
        if m.len() <= CHUNK_LEN || m.len() > MOST_CHUNKS * CHUNK_LEN {
            out[i] = *one(m).as_bytes();
            continue;
        }
        let (full, chunks) = (m.len() / CHUNK_LEN, m.len().div_ceil(CHUNK_LEN));
        let at = cvs.len();
        cvs.resize(at + chunks, [0; OUT_LEN]);
        if full < chunks {
            // The partial last chunk: not a root, as chunks came before.
            let mut h = new_hasher();
            h.set_input_offset((full * CHUNK_LEN) as u64);
            h.update(&m[full * CHUNK_LEN..]);
            cvs[at + full] = h.finalize_non_root();
        }
        most_full = most_full.max(full);
        long.push(Long {
            message: i,
            at,
            len: chunks,
        });
    }
    let mut inputs: Vec<&[u8; CHUNK_LEN]> = Vec::with_capacity(long.len());
    let mut to: Vec<usize> = Vec::with_capacity(long.len());
    let mut hashed = vec![0u8; OUT_LEN * long.len()];
    for j in 0..most_full {
        inputs.clear();
        to.clear();
        for l in &long {
            let m = messages[l.message];
            if let Some(chunk) = m.get(j * CHUNK_LEN..(j + 1) * CHUNK_LEN) {
                inputs.push(chunk.try_into().expect("a chunk's length"));
                to.push(l.at + j);
            }
        }
        let out = &mut hashed[..OUT_LEN * inputs.len()];
        platform.hash_many(
            &inputs,
            &words,
            j as u64,
            IncrementCounter::No,
            mode,
            CHUNK_START,
            CHUNK_END,
            out,
        );
        for (cv, &t) in out.chunks_exact(OUT_LEN).zip(&to) {
            cvs[t].copy_from_slice(cv);
        }
    }
    // Level by level: every pair of neighbours becomes its parent in place
    // at the front of the message's run, an odd last value moves up as is.
    let (mut parents, mut roots) = (Vec::new(), Vec::new());
    while !long.is_empty() {
        parents.clear();
        roots.clear();
        for l in &long {
            let level = &cvs[l.at..l.at + l.len];
            let into = if l.len == 2 { &mut roots } else { &mut parents };
            into.extend(level.chunks_exact(2).map(|p| block_of(&p[0], &p[1])));
        }
        let parent_cvs = compress_blocks(platform, &words, &parents, mode | PARENT);
        let root_cvs = compress_blocks(platform, &words, &roots, mode | PARENT | ROOT);
        let (mut p, mut r) = (
            parent_cvs.chunks_exact(OUT_LEN),
            root_cvs.chunks_exact(OUT_LEN),
        );
        long.retain_mut(|l| {
            if l.len == 2 {
                out[l.message].copy_from_slice(r.next().expect("a root per message"));
                return false;
            }
            for k in 0..l.len / 2 {
                cvs[l.at + k].copy_from_slice(p.next().expect("a parent per pair"));
            }
            if l.len % 2 == 1 {
                cvs[l.at + l.len / 2] = cvs[l.at + l.len - 1];
            }
            l.len = l.len.div_ceil(2);
            true
        });
    }
    out
}

/// A message of more than one chunk: its chaining values are
/// `cvs[at..at + len]`.
struct Long {
    message: usize,
    at: usize,
    len: usize,
}

fn block_of(left: &Cv, right: &Cv) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[..OUT_LEN].copy_from_slice(left);
    b[OUT_LEN..].copy_from_slice(right);
    b
}

/// Each 64-byte block compressed from `key`, counter 0, with `flags`:
/// parents' chaining values, or with ROOT a root's hash.
fn compress_blocks(platform: Platform, key: &[u32; 8], blocks: &[[u8; 64]], flags: u8) -> Vec<u8> {
    let mut out = vec![0u8; OUT_LEN * blocks.len()];
    let inputs: Vec<&[u8; 64]> = blocks.iter().collect();
    platform.hash_many(&inputs, key, 0, IncrementCounter::No, flags, 0, 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect()
    }

    fn agrees(messages: &[&[u8]]) {
        let key = [0x5a; 32];
        for (m, h) in messages.iter().zip(keyed_hash_many(&key, messages)) {
            assert_eq!(
                h,
                *blake3::keyed_hash(&key, m).as_bytes(),
                "keyed, {} bytes",
                m.len()
            );
        }
        let got = hash_many(messages);
        assert_eq!(got.len(), messages.len());
        for (m, h) in messages.iter().zip(got) {
            assert_eq!(
                h,
                *blake3::hash(m).as_bytes(),
                "a message of {} bytes",
                m.len()
            );
        }
    }

    #[test]
    fn every_length_around_chunk_and_tree_boundaries() {
        let data = bytes(70 << 10, 7);
        let mut lens: Vec<usize> = (0..=2100).collect();
        // 31-33 straddle MOST_CHUNKS: batched and hashed alone.
        assert_eq!(MOST_CHUNKS, 32);
        for k in [3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65] {
            let c = k * CHUNK_LEN;
            lens.extend([c - 65, c - 64, c - 1, c, c + 1, c + 63, c + 64, c + 65]);
        }
        // Alone, and all at once (every length beside every other).
        for &l in &lens {
            agrees(&[&data[..l]]);
        }
        let all: Vec<&[u8]> = lens.iter().map(|&l| &data[l % 97..][..l]).collect();
        agrees(&all);
        agrees(&[]);
    }

    proptest! {
        #[test]
        fn random_batches_hash_as_one_by_one(
            lens in proptest::collection::vec(0usize..40_000, 0..40),
            seed in any::<u8>(),
        ) {
            let data = bytes(80_000, seed);
            let messages: Vec<&[u8]> =
                lens.iter().enumerate().map(|(i, &l)| &data[i * 13..][..l]).collect();
            agrees(&messages);
        }
    }
}
