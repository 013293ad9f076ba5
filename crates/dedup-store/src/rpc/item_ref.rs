//! An `Append` decoded in place: its segments' bytes are borrowed from the
//! frame they came in, not copied out into a vector each; and encoded from
//! where they are, by the client, from the blocks it read. The types mirror
//! `Call::Append` and `Item` on the wire exactly (tests hold them to it).

use serde::ser::{SerializeStruct, SerializeStructVariant};
use serde::{Deserialize, Serialize, Serializer};

use super::protocol::Item;

/// An `Item` whose bytes are borrowed. Same variants, in the same order.
#[derive(Debug, PartialEq, Deserialize, Serialize)]
pub(crate) enum ItemRef<'a> {
    Known {
        fingerprint: [u8; 32],
    },
    New {
        fingerprint: [u8; 32],
        // As bytes, as `Item`'s: the same encoding as a sequence of u8
        // in postcard, but written at once rather than a byte at a time.
        #[serde(serialize_with = "serde_bytes::serialize")]
        data: &'a [u8],
    },
    Parent {
        offset: u64,
        len: u64,
    },
    Unhashed {
        #[serde(serialize_with = "serde_bytes::serialize")]
        data: &'a [u8],
    },
}

impl<'a> ItemRef<'a> {
    /// The segment's bytes, for an item that carries them.
    pub(crate) fn data(&self) -> Option<&'a [u8]> {
        match *self {
            ItemRef::New { data, .. } | ItemRef::Unhashed { data } => Some(data),
            ItemRef::Known { .. } | ItemRef::Parent { .. } => None,
        }
    }
}

impl<'a> From<&'a Item> for ItemRef<'a> {
    fn from(item: &'a Item) -> ItemRef<'a> {
        match item {
            Item::Known { fingerprint } => ItemRef::Known {
                fingerprint: *fingerprint,
            },
            Item::New { fingerprint, data } => ItemRef::New {
                fingerprint: *fingerprint,
                data,
            },
            Item::Parent { offset, len } => ItemRef::Parent {
                offset: *offset,
                len: *len,
            },
            Item::Unhashed { data } => ItemRef::Unhashed { data },
        }
    }
}

/// `Call::Append`'s place among `Call`'s variants, which postcard writes
/// as a varint after the request's id.
const APPEND: u32 = 4;

/// An append's id, session and items.
pub(crate) type Append<'a> = (u64, u64, Vec<ItemRef<'a>>);

/// `Request { id, call: Call::Append { session, items } }` with borrowed
/// items, encoded as that request is.
pub(crate) struct AppendOut<'i, 'a> {
    pub(crate) id: u64,
    pub(crate) session: u64,
    pub(crate) items: &'i [ItemRef<'a>],
}

impl Serialize for AppendOut<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Call<'o, 'i, 'a>(&'o AppendOut<'i, 'a>);
        impl Serialize for Call<'_, '_, '_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut v = s.serialize_struct_variant("Call", APPEND, "Append", 2)?;
                v.serialize_field("session", &self.0.session)?;
                v.serialize_field("items", self.0.items)?;
                v.end()
            }
        }
        let mut r = s.serialize_struct("Request", 2)?;
        r.serialize_field("id", &self.id)?;
        r.serialize_field("call", &Call(self))?;
        r.end()
    }
}

/// Whether the request in `body` is an `Append` (read as far as its call).
pub(crate) fn is_append(body: &[u8]) -> bool {
    let Ok((_id, rest)) = postcard::take_from_bytes::<u64>(body) else {
        return false;
    };
    matches!(postcard::take_from_bytes::<u32>(rest), Ok((APPEND, _)))
}

/// The `Append` in `body` (`is_append`), decoded in place.
pub(crate) fn append_in_place(body: &[u8]) -> Result<Append<'_>, String> {
    let undecodable = |e: postcard::Error| format!("undecodable message: {e}");
    let (id, rest) = postcard::take_from_bytes::<u64>(body).map_err(undecodable)?;
    let (_call, rest) = postcard::take_from_bytes::<u32>(rest).map_err(undecodable)?;
    match postcard::take_from_bytes::<(u64, Vec<ItemRef<'_>>)>(rest) {
        Ok(((session, items), [])) => Ok((id, session, items)),
        Ok((_, rest)) => Err(format!("{} bytes after the message", rest.len())),
        Err(e) => Err(undecodable(e)),
    }
}

/// Whether decoding `body` in place agrees with decoding it as a
/// `Request`: both fail, or both give the same append. For the fuzz
/// target and the tests.
pub(crate) fn agrees_with_owned(body: &[u8]) -> bool {
    use super::frame::decode;
    use super::protocol::{Call, Request};
    if !is_append(body) {
        return !matches!(
            decode::<Request>(body),
            Ok(Request {
                call: Call::Append { .. },
                ..
            })
        );
    }
    match (append_in_place(body), decode::<Request>(body)) {
        (Err(_), Err(_)) => true,
        (
            Ok((id, session, items)),
            Ok(Request {
                id: owned_id,
                call:
                    Call::Append {
                        session: owned_session,
                        items: owned,
                    },
            }),
        ) => {
            let owned: Vec<ItemRef<'_>> = owned.iter().map(ItemRef::from).collect();
            (id, session, items) == (owned_id, owned_session, owned)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::protocol::{Call, Request};
    use proptest::prelude::*;

    fn encoded(call: Call) -> Vec<u8> {
        postcard::to_allocvec(&Request { id: 300, call }).unwrap()
    }

    /// An `Append` of every kind of item decodes in place to what it
    /// holds; no other call is taken for one; a cut or overlong append
    /// is an error.
    #[test]
    fn an_append_decodes_in_place_to_what_was_sent() {
        let items = vec![
            Item::Known {
                fingerprint: [1; 32],
            },
            Item::New {
                fingerprint: [2; 32],
                data: vec![7; 300],
            },
            Item::Parent {
                offset: 1 << 40,
                len: 9,
            },
            Item::Unhashed { data: vec![8; 5] },
        ];
        let body = encoded(Call::Append {
            session: 1 << 33,
            items: items.clone(),
        });
        assert!(is_append(&body));
        let refs: Vec<ItemRef<'_>> = items.iter().map(ItemRef::from).collect();
        let out = AppendOut {
            id: 300,
            session: 1 << 33,
            items: &refs,
        };
        assert_eq!(
            postcard::to_allocvec(&out).unwrap(),
            body,
            "encoded from borrowed bytes"
        );
        let (id, session, got) = append_in_place(&body).unwrap();
        assert_eq!((id, session), (300, 1 << 33));
        let want: Vec<ItemRef<'_>> = items.iter().map(ItemRef::from).collect();
        assert_eq!(got, want);

        for other in [
            Call::Lookup {
                session: 4,
                fingerprints: vec![[4; 32]],
            },
            Call::List,
            Call::Hello { protocol: 4 },
        ] {
            assert!(!is_append(&encoded(other)));
        }
        assert!(!is_append(&[]));
        assert!(append_in_place(&body[..body.len() - 1]).is_err());
        let mut long = body.clone();
        long.push(0);
        let e = append_in_place(&long).unwrap_err();
        assert!(e.contains("1 bytes after"), "{e}");
    }

    /// Every byte of an append flipped, and every cut of it: decoding in
    /// place agrees with decoding it whole, failing or not.
    #[test]
    fn a_damaged_append_decodes_in_place_as_it_decodes_whole() {
        let body = encoded(Call::Append {
            session: 7,
            items: vec![
                Item::New {
                    fingerprint: [2; 32],
                    data: vec![7; 20],
                },
                Item::Unhashed { data: vec![8; 5] },
                Item::Known {
                    fingerprint: [1; 32],
                },
                Item::Parent { offset: 3, len: 9 },
            ],
        });
        for i in 0..body.len() {
            for flip in [1u8, 0x80, 0xff] {
                let mut bad = body.clone();
                bad[i] ^= flip;
                assert!(agrees_with_owned(&bad), "byte {i} ^ {flip:#x}");
            }
            assert!(agrees_with_owned(&body[..i]), "cut at {i}");
        }
    }

    fn item() -> impl Strategy<Value = Item> {
        // Lengths across postcard's varint steps (128, 16384) and past.
        let data = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::collection::vec(any::<u8>(), 16_300..16_500),
            Just(vec![9u8; 70_000]),
        ];
        prop_oneof![
            any::<[u8; 32]>().prop_map(|fingerprint| Item::Known { fingerprint }),
            (any::<[u8; 32]>(), data.clone())
                .prop_map(|(fingerprint, data)| Item::New { fingerprint, data }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Item::Parent { offset, len }),
            data.prop_map(|data| Item::Unhashed { data }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The client's append, encoded from borrowed bytes, is byte for
        /// byte the `Request` the server decodes (ids and sessions of
        /// every size, items of every kind and length).
        #[test]
        fn an_append_out_encodes_as_the_owned_request(
            id in any::<u64>(),
            session in any::<u64>(),
            items in proptest::collection::vec(item(), 0..12),
        ) {
            let refs: Vec<ItemRef<'_>> = items.iter().map(ItemRef::from).collect();
            let out = AppendOut { id, session, items: &refs };
            let borrowed = postcard::to_allocvec(&out).unwrap();
            drop(refs);
            let owned = postcard::to_allocvec(&Request { id, call: Call::Append { session, items } });
            prop_assert_eq!(borrowed, owned.unwrap());
        }
    }
}
