//! The entry point of the `parse_trace` fuzz target, here so that a CI
//! test can run it over many inputs too.

use crate::native::Writer;
use crate::reader::TraceReader;
use crate::request::Request;

/// Parse `data` leniently and strictly, write the requests that parsed in
/// dedup's format, parse that again, and insist on the same requests.
pub fn parse_trace(data: &[u8]) {
    let _strict: Vec<_> = TraceReader::new(data, true).collect();
    let reqs: Vec<Request> = TraceReader::new(data, false)
        .filter_map(Result::ok)
        .collect();
    let mut w = Writer::new(Vec::new()).expect("writing to memory");
    for r in &reqs {
        w.write(r).expect("writing to memory");
    }
    let text = w.into_inner();
    let mut again = TraceReader::new(&text[..], true);
    for (i, r) in reqs.iter().enumerate() {
        let back = again
            .next()
            .expect("as many requests")
            .expect("dedup's own output parses");
        // FIU's whole-request seeds are written as per-block seeds.
        assert_eq!(
            (back.op, back.fua, back.offset, back.len, back.block_seeds()),
            (r.op, r.fua, r.offset, r.len, r.block_seeds()),
            "request {i}"
        );
    }
    assert!(again.next().is_none());
}
