//! `--segments` as users type it: every form parses to the sizes it names,
//! and anything `fastcdc` or a container would not take is refused with
//! the reason.

use dedup_store::segmenter::Segmenting;

#[test]
fn every_form_parses_to_its_sizes() {
    let cases = [
        ("fixed", Segmenting::Fixed { size: 4096 }),
        ("FIXED", Segmenting::Fixed { size: 4096 }),
        ("fixed:8K", Segmenting::Fixed { size: 8192 }),
        ("fixed:512", Segmenting::Fixed { size: 512 }),
        (
            "fastcdc",
            Segmenting::FastCdc {
                min: 2048,
                avg: 8192,
                max: 32768,
            },
        ),
        ("fastcdc:4K", Segmenting::FASTCDC_4K),
        (
            "fastcdc:16KiB",
            Segmenting::FastCdc {
                min: 4096,
                avg: 16384,
                max: 65536,
            },
        ),
        (
            "fastcdc:8K:1K:64K",
            Segmenting::FastCdc {
                min: 1024,
                avg: 8192,
                max: 65536,
            },
        ),
    ];
    for (text, want) in cases {
        assert_eq!(Segmenting::parse(text), Ok(want), "{text}");
    }
    assert_eq!(
        Segmenting::FASTCDC_8K,
        Segmenting::parse("fastcdc").unwrap()
    );
}

#[test]
fn bad_forms_are_refused_with_the_reason() {
    let cases = [
        ("", "unknown segmenting"),
        ("rabin", "unknown segmenting"),
        ("fixed:", "invalid size"),
        ("fixed:4K:8K", "unknown segmenting"),
        ("fastcdc:8K:1K", "unknown segmenting"),
        ("fastcdc:1K:2K:4K", "out of order: need min <= avg <= max"),
        ("fastcdc:8M", "FastCDC minimum size 2097152 is out of range"),
        (
            "fastcdc:8M:1M:16M",
            "FastCDC average size 8388608 is out of range",
        ),
        ("fastcdc:128", "FastCDC minimum size 32 is out of range"),
        (
            "fastcdc:8K:1K:32M",
            "FastCDC maximum size 33554432 is out of range",
        ),
        ("fastcdc:12K", "not a power of two"),
        ("fixed:0", "fixed segment size 0 is too small"),
        ("fixed:511", "fixed segment size 511 is too small"),
        ("fixed:17M", "fixed segment size 17825792 is out of range"),
        ("fixed:8G", "too large"),
        ("fastcdc:x", "invalid size"),
    ];
    for (text, want) in cases {
        let err = Segmenting::parse(text).expect_err(text);
        assert!(err.contains(want), "{text}: {err}");
    }
}
