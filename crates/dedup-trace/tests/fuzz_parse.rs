//! The `parse_trace` fuzz target's entry point over random and mutated
//! traces, in CI: parsing never panics and dedup's own output always
//! parses back to the same requests.

use dedup_trace::fuzzing::parse_trace;
use proptest::prelude::*;

const SAMPLE: &str = "# dedup-trace 1\n\
    0 W 0 4096 531e779ca0ab2d3be6d2f9fca2d2f5e1\n\
    10 W! 100 5000 531e779ca0ab2d3be6d2f9fca2d2f5e1,0\n\
    20 R 0 8192\n30 T! 4096 512\n40 Z 0 4096\n50 F 0 0\n";
const FIU: &str =
    "89966527788578 4893 syslogd 904265560 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1\n\
    89966527788600 1 kworker/0:1 my 16 24 R 8 0 0f343b0931126a20f133d67c2b018a3b\n";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        parse_trace(&data);
    }

    #[test]
    fn mutated_traces(
        fiu in any::<bool>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut data = if fiu { FIU } else { SAMPLE }.as_bytes().to_vec();
        for (at, byte) in edits {
            let i = at % data.len();
            // Keep most mutations printable so they reach the field parsers.
            data[i] = if byte < 200 { b" 0123456789abcdefWRTZF!,#\n-x"[byte as usize % 28] } else { byte };
        }
        parse_trace(&data);
    }
}

#[test]
fn the_samples_parse_whole() {
    let n = dedup_trace::TraceReader::new(SAMPLE.as_bytes(), true)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len();
    assert_eq!(n, 6);
    let n = dedup_trace::TraceReader::new(FIU.as_bytes(), true)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len();
    assert_eq!(n, 2);
    parse_trace(SAMPLE.as_bytes());
    parse_trace(FIU.as_bytes());
}
