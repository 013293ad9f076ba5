//! The object-store seam's model: random operations on a store checked
//! against a `BTreeMap` (shared by the `LocalDir` and S3 tests).

use std::collections::BTreeMap;

use dedup_store::{Error, ObjectStore};
use proptest::prelude::*;

/// Names chosen so that none is a directory of another (a name cannot be
/// both a file and a directory, in S3's model as in this test's).
pub const NAMES: [&str; 6] = ["a", "b.1", "d/x", "d/y", "d/e/z", "f-2"];
pub const PREFIXES: [&str; 8] = ["", "a", "d", "d/", "d/e", "d/e/", "f", "zz/"];

#[derive(Clone, Debug)]
pub enum Op {
    Put(usize, Vec<u8>),
    Get(usize),
    GetRange(usize, u64, u64),
    GetTail(usize, u64),
    List(usize),
    /// A prefix, and the name the listing starts after.
    ListAfter(usize, usize),
    Delete(usize),
}

pub fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        3 => (name.clone(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(n, b)| Op::Put(n, b)),
        2 => name.clone().prop_map(Op::Get),
        2 => (name.clone(), 0..80u64, 0..80u64).prop_map(|(n, o, l)| Op::GetRange(n, o, l)),
        1 => (name.clone(), 0..80u64).prop_map(|(n, l)| Op::GetTail(n, l)),
        1 => (0..PREFIXES.len()).prop_map(Op::List),
        1 => (0..PREFIXES.len(), 0..NAMES.len()).prop_map(|(p, n)| Op::ListAfter(p, n)),
        2 => name.prop_map(Op::Delete),
    ]
}

/// What the store answered, reduced to what the model can predict.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Ok,
    Bytes(Vec<u8>),
    Names(Vec<String>),
    Exists,
    NotFound,
    OutOfRange { size: u64 },
}

pub fn outcome<T>(r: dedup_store::Result<T>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(Error::Exists { .. }) => Outcome::Exists,
        Err(Error::NotFound { .. }) => Outcome::NotFound,
        Err(Error::OutOfRange { size, .. }) => Outcome::OutOfRange { size },
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// What a store holding `model` answers to `op`. `directory`: a directory's
/// answers; S3's differ in two: deleting a missing object is `Ok` (S3
/// cannot tell), and so is a put of exactly the bytes a name holds (it
/// cannot be told from a retry of our own put).
pub fn model_step(model: &mut BTreeMap<String, Vec<u8>>, op: &Op, directory: bool) -> Outcome {
    let get = |n: usize| model.get(NAMES[n]).cloned();
    match op {
        Op::Put(n, bytes) => {
            if let Some(there) = model.get(NAMES[*n]) {
                if !directory && there == bytes {
                    Outcome::Ok
                } else {
                    Outcome::Exists
                }
            } else {
                model.insert(NAMES[*n].into(), bytes.clone());
                Outcome::Ok
            }
        }
        Op::Get(n) => get(*n).map_or(Outcome::NotFound, Outcome::Bytes),
        Op::GetRange(n, off, len) => match get(*n) {
            None => Outcome::NotFound,
            Some(b) if off + len > b.len() as u64 => Outcome::OutOfRange {
                size: b.len() as u64,
            },
            Some(b) => Outcome::Bytes(b[*off as usize..(off + len) as usize].to_vec()),
        },
        Op::GetTail(n, len) => match get(*n) {
            None => Outcome::NotFound,
            Some(b) => Outcome::Bytes(b[b.len() - (*len as usize).min(b.len())..].to_vec()),
        },
        Op::List(p) => Outcome::Names(
            model
                .keys()
                .filter(|k| k.starts_with(PREFIXES[*p]))
                .cloned()
                .collect(),
        ),
        Op::ListAfter(p, n) => Outcome::Names(
            model
                .keys()
                .filter(|k| k.starts_with(PREFIXES[*p]) && k.as_str() > NAMES[*n])
                .cloned()
                .collect(),
        ),
        Op::Delete(n) => match model.remove(NAMES[*n]) {
            Some(_) => Outcome::Ok,
            None if directory => Outcome::NotFound,
            None => Outcome::Ok,
        },
    }
}

pub fn store_step(store: &dyn ObjectStore, op: &Op) -> Outcome {
    match op {
        Op::Put(n, bytes) => outcome(store.put(NAMES[*n], bytes), |()| Outcome::Ok),
        Op::Get(n) => outcome(store.get(NAMES[*n]), Outcome::Bytes),
        Op::GetRange(n, off, len) => {
            outcome(store.get_range(NAMES[*n], *off, *len), Outcome::Bytes)
        }
        Op::GetTail(n, len) => outcome(store.get_tail(NAMES[*n], *len), Outcome::Bytes),
        Op::List(p) => outcome(store.list(PREFIXES[*p]), Outcome::Names),
        Op::ListAfter(p, n) => outcome(store.list_after(PREFIXES[*p], NAMES[*n]), Outcome::Names),
        Op::Delete(n) => outcome(store.delete(NAMES[*n]), |()| Outcome::Ok),
    }
}
