//! The entry points of the backup store's fuzz targets
//! (`fuzz/fuzz_targets/store_objects.rs` and `store_wire.rs`), here so
//! that a test runs them over many inputs in CI too. Everything a
//! repository holds is read back as untrusted bytes, and so is every frame
//! from the network: none of it may panic, or allocate past its bounds.

use crate::gc::Marks;
use crate::index::{Index, IndexConfig};
use crate::recipe::parts::RecipeObject;
use crate::rpc::frame::{decode, read_frame, write_frame};
use crate::rpc::protocol::{Request, Response, MAX_FRAME};
use crate::{BackupRecord, Container, Recipe, RepoConfig};

/// Decoders of repository objects, chosen by the first byte.
pub const OBJECT_KINDS: u8 = 12;

/// Decode `data[1..]` as the kind of object `data[0]` names (modulo
/// [`OBJECT_KINDS`]); a container that parses has every segment read.
pub fn objects(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    let name = "fuzz";
    match kind % OBJECT_KINDS {
        0 => {
            if let Ok(c) = Container::parse(name, bytes.to_vec()) {
                for i in 0..=c.catalog().entries().len() {
                    let _ = c.segment(i);
                }
            }
        }
        1 => drop(crate::tree::Tree::decode(name, bytes)),
        2 => drop(Recipe::decode(name, bytes)),
        3 => drop(RecipeObject::decode(name, bytes)),
        4 => drop(BackupRecord::decode(name, bytes)),
        5 => drop(RepoConfig::decode(bytes)),
        6 => drop(Marks::decode(name, bytes)),
        7 => drop(Index::from_checkpoint(bytes, IndexConfig::default())),
        // The one object read in the clear in an encrypted repository.
        8 => drop(crate::crypto::keys::params_of(name, bytes)),
        // Named as their first 8 body bytes say, so that a record that
        // parses reaches the check of its name too.
        10 => {
            let name = crate::epochs::EpochRecord::object_name(epoch_in(bytes));
            drop(crate::epochs::EpochRecord::decode(&name, bytes))
        }
        11 => {
            let name = crate::epochs::PinRecord::object_name(epoch_in(bytes), "w", 0);
            drop(crate::epochs::PinRecord::decode(&name, bytes))
        }
        _ => {
            use crate::crypto::sealed::{open, Layout, ObjectKey};
            if let Some(layout) = Layout::of_sealed(bytes.len() as u64) {
                let _ = open(
                    &ObjectKey::new(&[7; 32]),
                    name,
                    layout,
                    0,
                    bytes.to_vec(),
                    0,
                );
            }
        }
    }
}

/// The epoch an epoch record's or pin's frame holds first in its body.
fn epoch_in(bytes: &[u8]) -> u64 {
    bytes
        .get(12..20)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Read `data` as a connection's frames, each decoded as a request (as a
/// server reads them) and as a response (as a client does, a restore's
/// `Chunk`s and `Damaged` ranges among them); a request or response that
/// decodes must encode and decode again to the same one, and an append
/// decoded in place must be the one decoded whole.
pub fn wire(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some(body)) = read_frame(&mut rest, MAX_FRAME) {
        // The server decodes appends in place: it must agree.
        assert!(crate::rpc::item_ref::agrees_with_owned(&body));
        if let Ok(req) = decode::<Request>(&body) {
            round_trips(&req);
        }
        if let Ok(resp) = decode::<Response>(&body) {
            round_trips(&resp);
        }
    }
}

/// `m` encodes, and decodes again to itself.
fn round_trips<M>(m: &M)
where
    M: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut again = Vec::new();
    write_frame(&mut again, m).expect("a decoded message encodes");
    let back = read_frame(&mut &again[..], MAX_FRAME)
        .expect("reading memory")
        .expect("one frame");
    let back = decode::<M>(&back).expect("an encoded message decodes");
    assert_eq!(format!("{back:?}"), format!("{m:?}"));
}
