//! Model-based test: random sequences of write / read / trim / flush / gc /
//! clean reopen / crash+recover over a small device with a small alphabet of
//! contents (so duplicates are common), checked after every step against a
//! plain in-memory disk, with the metadata checked for consistency too.

mod common;

use common::{MemDevice, ModelDisk, Patterns};
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{Device, Error};
use proptest::prelude::*;

const LOGICAL_CHUNKS: u64 = 12;
const PATTERNS: usize = 5;

#[derive(Clone, Debug)]
enum Op {
    /// Whole aligned chunks of one pattern: the dedup-heavy case.
    WriteChunks {
        lbn: u64,
        chunks: u64,
        pattern: usize,
        fua: bool,
    },
    /// Any byte range: read-modify-write at the edges.
    WriteBytes {
        offset: u64,
        len: u64,
        pattern: usize,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        fua: bool,
    },
    Flush,
    Gc,
    Reopen,
    Crash,
}

#[derive(Clone, Debug)]
struct Setup {
    chunk_size: u32,
    physical_chunks: u64,
    hash: HashAlgo,
    verify: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(4096u32), Just(8192u32)],
        prop_oneof![Just(5u64), Just(8), Just(16)],
        prop_oneof![
            Just(HashAlgo::Blake3),
            Just(HashAlgo::Sha256),
            Just(HashAlgo::Md5)
        ],
        any::<bool>(),
    )
        .prop_map(|(chunk_size, physical_chunks, hash, verify)| Setup {
            chunk_size,
            physical_chunks,
            hash,
            verify,
        })
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    let range = (0..size, 1..size / 2).prop_map(move |(o, l)| (o, l.min(size - o)));
    prop_oneof![
        6 => (0..LOGICAL_CHUNKS, 1..4u64, 0..PATTERNS, any::<bool>()).prop_map(|(lbn, n, pattern, fua)| {
            Op::WriteChunks { lbn, chunks: n.min(LOGICAL_CHUNKS - lbn), pattern, fua }
        }),
        4 => (range.clone(), 0..PATTERNS).prop_map(|((offset, len), pattern)| Op::WriteBytes { offset, len, pattern }),
        3 => range.clone().prop_map(|(offset, len)| Op::Read { offset, len }),
        2 => range.clone().prop_map(|(offset, len)| Op::Trim { offset, len }),
        1 => (range, any::<bool>()).prop_map(|((offset, len), fua)| Op::WriteZeroes { offset, len, fua }),
        1 => Just(Op::Flush),
        1 => Just(Op::Gc),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

struct Harness {
    md: MemDevice,
    dev: Option<Device>,
    model: ModelDisk,
    /// Contents as of the last clean close: what a crash rolls back to.
    saved: ModelDisk,
    patterns: Patterns,
}

impl Harness {
    fn dev(&self) -> &Device {
        self.dev.as_ref().expect("device is open")
    }

    /// Apply a mutation that may fail with ENOSPC (writes, and trims that
    /// zero part of a chunk, which makes new content).
    fn mutate(
        &mut self,
        offset: u64,
        len: u64,
        after: ModelDisk,
        f: impl FnOnce(&Device) -> dedup_core::Result<()>,
    ) {
        let cs = self.model.chunk_size as u64;
        match f(self.dev()) {
            Ok(()) => self.model = after,
            Err(Error::NoSpace { .. }) => {
                // A failed write leaves each chunk of its range either as it
                // was or as written; nothing outside the range changes.
                for lbn in offset / cs..(offset + len).div_ceil(cs) {
                    let mut got = vec![0u8; cs as usize];
                    self.dev().read(lbn * cs, &mut got).unwrap();
                    let (old, new) = (self.model.chunk(lbn as usize), after.chunk(lbn as usize));
                    assert!(
                        got == old || got == new,
                        "chunk {lbn} holds neither old nor new data after ENOSPC"
                    );
                    self.model.write(lbn * cs, &got);
                }
            }
            Err(e) => panic!("mutation failed: {e}"),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8], fua: bool) {
        let mut after = self.model.clone();
        after.write(offset, data);
        self.mutate(offset, data.len() as u64, after, |d| {
            d.write(offset, data, fua)
        });
    }

    fn step(&mut self, op: &Op) {
        let cs = self.model.chunk_size as u64;
        match *op {
            Op::WriteChunks {
                lbn,
                chunks,
                pattern,
                fua,
            } => {
                let data = self
                    .patterns
                    .bytes(pattern, lbn * cs, (chunks * cs) as usize);
                self.write(lbn * cs, &data, fua);
            }
            Op::WriteBytes {
                offset,
                len,
                pattern,
            } => {
                let data = self.patterns.bytes(pattern, offset, len as usize);
                self.write(offset, &data, false);
            }
            Op::Read { offset, len } => {
                let mut got = vec![0u8; len as usize];
                self.dev().read(offset, &mut got).unwrap();
                assert_eq!(
                    &got[..],
                    self.model.read(offset, len as usize),
                    "read {len} at {offset}"
                );
            }
            Op::Trim { offset, len } => {
                let mut after = self.model.clone();
                after.zero(offset, len);
                self.mutate(offset, len, after, |d| d.discard(offset, len, false));
            }
            Op::WriteZeroes { offset, len, fua } => {
                let mut after = self.model.clone();
                after.zero(offset, len);
                self.mutate(offset, len, after, |d| d.write_zeroes(offset, len, fua));
            }
            Op::Flush => self.dev().flush().unwrap(),
            Op::Gc => {
                self.dev().gc().unwrap();
                let (nonzero, distinct) = self.model.nonzero_and_distinct();
                let s = self.dev().stats();
                assert_eq!(
                    s.chunks_stored, distinct,
                    "after GC, stored chunks = distinct live contents"
                );
                assert_eq!(s.chunks_mapped, nonzero);
            }
            Op::Reopen => {
                let dev = self.dev.take().unwrap();
                dev.close().unwrap();
                drop(dev);
                self.dev = Some(self.md.open().unwrap());
                self.saved = self.model.clone();
                assert_eq!(
                    common::read_all(self.dev()),
                    self.model.bytes,
                    "after a clean reopen"
                );
            }
            Op::Crash => {
                drop(self.dev.take());
                match self.md.open() {
                    Err(Error::Unclean { .. }) => {}
                    other => panic!(
                        "an unclean INRAM device must be refused, got {:?}",
                        other.map(|_| ())
                    ),
                }
                self.dev = Some(self.md.open_with(true).unwrap());
                let got = common::read_all(self.dev());
                for lbn in 0..self.model.chunks() {
                    let c = &got[lbn * cs as usize..(lbn + 1) * cs as usize];
                    assert!(
                        c == self.saved.chunk(lbn) || c.iter().all(|&b| b == 0),
                        "after recovery chunk {lbn} must read its last saved content or zeros"
                    );
                }
                self.model.bytes = got;
                // Recovery ends with a clean state only at the next close.
            }
        }
        let report = self.dev().check(true).unwrap();
        assert!(report.is_clean(), "after {op:?}: {:#?}", report.problems);
        let (nonzero, _) = self.model.nonzero_and_distinct();
        assert_eq!(self.dev().stats().chunks_mapped, nonzero, "after {op:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_a_plain_disk(setup in setup(), ops in proptest::collection::vec(op(LOGICAL_CHUNKS * 8192), 1..60)) {
        let cs = setup.chunk_size as u64;
        let size = LOGICAL_CHUNKS * cs;
        let md = MemDevice::with(setup.chunk_size, LOGICAL_CHUNKS, setup.physical_chunks, setup.hash, setup.verify);
        let dev = md.open().unwrap();
        let mut h = Harness {
            md,
            dev: Some(dev),
            model: ModelDisk::new(size as usize, cs as usize),
            saved: ModelDisk::new(size as usize, cs as usize),
            patterns: Patterns::new(PATTERNS, cs as usize),
        };
        for op in &ops {
            // Ops are generated for the largest chunk size; fold them into this device.
            let op = fold(op, size);
            h.step(&op);
        }
        assert_eq!(common::read_all(h.dev()), h.model.bytes);
    }
}

fn fold(op: &Op, size: u64) -> Op {
    let clip = |offset: u64, len: u64| {
        let o = offset % size;
        (o, len.clamp(1, size - o))
    };
    match *op {
        Op::WriteBytes {
            offset,
            len,
            pattern,
        } => {
            let (offset, len) = clip(offset, len);
            Op::WriteBytes {
                offset,
                len,
                pattern,
            }
        }
        Op::Read { offset, len } => {
            let (offset, len) = clip(offset, len);
            Op::Read { offset, len }
        }
        Op::Trim { offset, len } => {
            let (offset, len) = clip(offset, len);
            Op::Trim { offset, len }
        }
        Op::WriteZeroes { offset, len, fua } => {
            let (offset, len) = clip(offset, len);
            Op::WriteZeroes { offset, len, fua }
        }
        ref other => other.clone(),
    }
}
