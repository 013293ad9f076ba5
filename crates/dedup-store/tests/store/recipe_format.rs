//! The recipe object: any recipe reads back as written, and arbitrary or
//! damaged bytes under a good frame, in every version, are refused or read
//! and never panic the reader.

use dedup_common::fingerprint::Fingerprint;
use dedup_store::format::crc;
use dedup_store::{Recipe, SegmentRef};
use proptest::prelude::*;

const MAGIC: [u8; 8] = *b"DDUPRCPE";

/// A frame as the repository writes one: magic, version, body, crc32c.
fn frame(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(body);
    let sum = crc(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// `body` as a compressed frame body: its length, then zstd.
fn packed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&zstd::encode_all(body, 1).unwrap());
    out
}

fn recipe() -> impl Strategy<Value = Recipe> {
    // Few distinct values, so runs repeat as in real recipes, and any.
    let reference = (
        prop_oneof![0..4u64, any::<u64>()],
        prop_oneof![0..8u32, any::<u32>()],
        prop_oneof![Just(4096u32), 1..70_000u32],
        prop_oneof![any::<[u8; 32]>(), Just([7; 32])],
    )
        .prop_map(|(container, entry, len, fp)| {
            SegmentRef::new(container, entry, len, &Fingerprint(fp))
        });
    prop::collection::vec(reference, 0..300).prop_map(|segments| Recipe {
        stream_len: segments.iter().map(|s| u64::from(s.len)).sum(),
        segments,
    })
}

proptest! {
    #[test]
    fn every_recipe_reads_back(recipe in recipe()) {
        let bytes = recipe.encode();
        prop_assert_eq!(Recipe::decode("r", &bytes).unwrap(), recipe);
    }

    #[test]
    fn arbitrary_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = Recipe::decode("r", &body);
        for version in 0..8 {
            let _ = Recipe::decode("r", &frame(version, &body));
            let _ = Recipe::decode("r", &frame(version, &packed(&body)));
        }
    }

    /// A real recipe's body, raw and compressed, with a byte changed and
    /// cut short, reframed with a good crc: read or refused, by name.
    #[test]
    fn damaged_bodies_never_panic(
        recipe in recipe(),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = recipe.encode();
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let stored = bytes[12..bytes.len() - 4].to_vec();
        // Version 6 is plain, versions 5 and 7 compressed.
        let compressed = version == 5 || version == 7;
        let mut bodies = vec![(version, stored.clone())];
        if compressed {
            bodies.push((version, packed(&zstd::decode_all(&stored[8..]).unwrap())));
        }
        // The raw body damaged, then compressed: it decompresses, so the
        // column decoder itself meets the damage.
        if compressed {
            let mut raw = zstd::decode_all(&stored[8..]).unwrap();
            let i = at.index(raw.len());
            raw[i] = value;
            raw.truncate(cut.index(raw.len() + 1));
            if let Err(e) = Recipe::decode("recipes/x", &frame(version, &packed(&raw))) {
                prop_assert!(e.to_string().contains("recipes/x"), "{}", e);
            }
        }
        for (version, mut body) in bodies {
            let i = at.index(body.len());
            body[i] = value;
            body.truncate(cut.index(body.len() + 1));
            if let Err(e) = Recipe::decode("recipes/x", &frame(version, &body)) {
                prop_assert!(e.to_string().contains("recipes/x"), "{}", e);
            }
        }
    }
}

/// A stream of one repeated segment (zeros, a device's unmapped blocks)
/// compresses too well for version 5's bound on expansion: a part's worth
/// of references is written as version 7 (compressed, its raw length
/// bounded by the references a part holds), a larger body plain (version
/// 6); both read.
#[test]
fn a_run_of_one_reference_is_written_small() {
    let run = |n: usize| Recipe {
        stream_len: 4096 * n as u64,
        segments: vec![SegmentRef::new(1, 0, 4096, &Fingerprint([9; 32])); n],
    };
    let part = run(50_000);
    let bytes = part.encode();
    assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
    assert!(
        bytes.len() < 2_000,
        "{} bytes for 50,000 references",
        bytes.len()
    );
    assert_eq!(Recipe::decode("r", &bytes).unwrap(), part);
    let over = run(70_000);
    let bytes = over.encode();
    assert_eq!(&bytes[8..12], &6u32.to_le_bytes());
    // Magic and version, the body, the crc32c.
    assert_eq!(bytes.len(), 12 + 16 + 24 * 70_000 + 4, "plain columns");
    assert_eq!(Recipe::decode("r", &bytes).unwrap(), over);
}

/// A version 7 body that names more than a part's references is refused
/// before it is decompressed, by name.
#[test]
fn a_run_body_past_a_part_is_refused() {
    let n = 70_000u64;
    let mut raw = Vec::new();
    raw.extend_from_slice(&(4096 * n).to_le_bytes());
    raw.extend_from_slice(&n.to_le_bytes());
    raw.resize(16 + 24 * n as usize, 0);
    let e = Recipe::decode("recipes/x", &frame(7, &packed(&raw))).unwrap_err();
    assert!(e.to_string().contains("recipes/x"), "{e}");
    assert!(e.to_string().contains("over the"), "{e}");
}
