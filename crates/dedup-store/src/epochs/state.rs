//! A writing process's place in the protocol: the newest epoch it
//! applied, its pins, and the container ids it hands out (`ids.rs`). The
//! steps that move it are `pinning.rs`'s, beside the repository.

use std::time::{Duration, Instant};

pub(crate) struct Epochs {
    /// The newest epoch whose record this process applied (and pinned at,
    /// if it held anything); 0 before any.
    pub(crate) applied: u64,
    /// Whether the epochs were read once (the first read applies every
    /// record still kept).
    pub(crate) started: bool,
    /// This process's name in its pins (random, per open).
    pub(crate) writer: String,
    /// Pins written so far: the next one's number.
    pub(crate) pins: u64,
    /// A range or an object joined what the pin must hold: pin before
    /// using it.
    pub(crate) dirty: bool,
    /// The id range being handed out, `(start, len)`, and the next id.
    pub(crate) range: Option<(u64, u64)>,
    pub(crate) next_id: u64,
    /// No id below this may be reserved (containers and checkpoints hold
    /// them).
    pub(crate) floor: u64,
    /// What this process held that epoch `applied` condemned: pinned at
    /// `applied` once `dirty` is false, and safe once a listing made after
    /// that pin finds no newer epoch; lost if one does. Kept here, not on
    /// the stack, so that a pin or listing that fails leaves it for the
    /// next look instead of forgetting it.
    pub(crate) at_risk: (Vec<u64>, Vec<String>),
    /// Containers about to be held that no backup here holds yet: the
    /// next pin holds them too (`Repository::hold_pinned`).
    pub(crate) about_to_hold: Vec<u64>,
    /// This process's newest pin, deleted once a newer one is put (the
    /// newer holds all it held that still needs holding).
    pub(crate) last_pin: Option<String>,
    /// Pins of this process that may be left in the store (a put whose
    /// outcome is unknown, a delete that failed): deleted at close with
    /// the last, instead of listing every pin to find them.
    pub(crate) stray_pins: Vec<String>,
    /// A long-lived process (a server): when its last backup ends, its
    /// pin is replaced by one holding only its id range.
    pub(crate) repin_when_idle: bool,
    /// The broken protocol, for the test that must catch it: no pins.
    pub(crate) skip_pins: bool,
    /// The newest epoch records this process read or wrote
    /// (`read_epoch_kept`).
    pub(crate) records: std::collections::BTreeMap<u64, super::EpochRecord>,
    /// When the epochs were last listed, and how long a look made only to
    /// keep up (at a seal or a recipe part) may wait after it
    /// (`Repository::keep_up_epochs`).
    pub(crate) listed: Option<Instant>,
    pub(crate) look_interval: Duration,
}

/// A backup keeps up with the epochs at each container it seals and each
/// recipe part it writes, but lists them at most this often for that:
/// those looks only pace it against collections (see FORMATS, "Pacing";
/// the argument that nothing live is deleted rests on the looks around a
/// pin and a commit, which are always made). A collection waits for a
/// writer behind it, so a writer looking every second costs a collection
/// at most about a second; looking at every seal cost a 2 GiB backup
/// into a bucket 55 of its 171 requests.
pub(crate) const LOOK_INTERVAL: Duration = Duration::from_secs(1);

impl Epochs {
    pub(crate) fn new(writer: String, floor: u64) -> Epochs {
        Epochs {
            applied: 0,
            started: false,
            writer,
            pins: 0,
            dirty: false,
            range: None,
            next_id: floor,
            floor,
            at_risk: Default::default(),
            about_to_hold: Vec::new(),
            last_pin: None,
            stray_pins: Vec::new(),
            repin_when_idle: false,
            skip_pins: false,
            records: Default::default(),
            listed: None,
            look_interval: LOOK_INTERVAL,
        }
    }

    /// No id below `floor` is handed out (found taken at open).
    pub(crate) fn raise_floor(&mut self, floor: u64) {
        self.floor = self.floor.max(floor);
        self.next_id = self.next_id.max(floor);
    }

    /// Whether a look only to keep up may be left out now: nothing to
    /// pin, nothing at risk, and the epochs listed within the interval.
    pub(crate) fn looked_lately(&self) -> bool {
        !self.dirty
            && self.at_risk.0.is_empty()
            && self.at_risk.1.is_empty()
            && self.listed_lately()
    }

    /// Whether the epochs were listed (after the first listing) within
    /// the look interval.
    pub(crate) fn listed_lately(&self) -> bool {
        self.started
            && self
                .listed
                .is_some_and(|at| at.elapsed() < self.look_interval)
    }

    /// This process's name in its pins.
    pub(crate) fn writer(&self) -> &str {
        &self.writer
    }

    /// Ids below this were handed out by this process or known taken at
    /// open: what an index checkpoint taken now may say it covers.
    pub(crate) fn covered(&self) -> u64 {
        self.next_id
    }
}
