//! The `analyze_tar` fuzz target's entry point over random and mutated tar
//! streams, in CI: a damaged stream never panics the analyzer, and every
//! algorithm accounts for exactly the bytes it read.

use dedup_analyze::fuzzing::analyze_tar;
use proptest::prelude::*;

fn sample() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, len) in [("a.txt", 3000usize), ("dir/b.bin", 9000), ("c", 0)] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(len as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn random_bytes(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        analyze_tar(&data);
    }

    #[test]
    fn mutated_streams(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut data = sample();
        for (at, byte) in edits {
            // Most edits in the headers, where the parser looks.
            let i = if at % 2 == 0 { at % 512 } else { at % data.len() };
            data[i] = byte;
        }
        if cut % 3 == 0 {
            data.truncate(cut % data.len());
        }
        analyze_tar(&data);
    }
}

#[test]
fn the_sample_is_read_whole() {
    analyze_tar(&sample());
}
