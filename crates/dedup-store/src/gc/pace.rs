//! A collection waits, a bounded while, for the writers still pinned at
//! the epoch before the newest to look at the newest, before it begins
//! the next one.
//!
//! Safety never depends on this (FORMATS.md, "Why no live segment is
//! deleted"): a writer that does not look between collections loses its
//! running backups, never data. But a writer looks only as it seals a
//! container, writes a recipe part or first reuses a container, and
//! collections of a small repository run in milliseconds: back to back,
//! they would stop every backup beside them ("run it again"). A writer
//! whose newest pin is at epoch *n*-2 has not pinned at *n*-1 yet, so it
//! may hold what *n*-1 condemned and not know; once it looks, it pins at
//! *n*-1 (it holds something: its pins say so) and collection *n* honours
//! that. The wait is measured on this machine's clock, which orders
//! nothing: a writer that never looks (dead on another machine, or stuck)
//! costs one wait of the bound, then its pins expire.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::epochs::{PinRecord, PINS_PREFIX};
use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::repo::Repository;

/// How often the pins are listed again while waiting.
const POLL: Duration = Duration::from_millis(50);

impl Repository {
    /// Wait up to `bound` until no writer (other than this process, its
    /// other handles, and those known dead here) has its newest pin at
    /// epoch `newest`-1: how many still had when the wait ended, and
    /// whether it slept at all.
    pub(super) fn wait_for_writers(&self, newest: u64, bound: Duration) -> RepoResult<(u64, bool)> {
        if newest == 0 || bound.is_zero() {
            return Ok((0, false));
        }
        let own = self.epochs().writer().to_string();
        let start = Instant::now();
        let mut slept = false;
        loop {
            // The wait only paces: a listing or read that fails ends it
            // (the collection's own requests then say what is wrong).
            let Ok(behind) = self.writers_behind(newest, &own) else {
                return Ok((0, slept));
            };
            if behind == 0 || start.elapsed() >= bound {
                return Ok((behind, slept));
            }
            std::thread::sleep(POLL.min(bound.saturating_sub(start.elapsed())));
            slept = true;
        }
    }

    /// The writers whose newest pin is at epoch `newest`-1.
    fn writers_behind(&self, newest: u64, own: &str) -> RepoResult<u64> {
        let mut latest: HashMap<String, (u64, String)> = HashMap::new();
        for name in self.store.list(PINS_PREFIX)? {
            let (Some(epoch), Some(writer)) =
                (PinRecord::epoch_of(&name), PinRecord::writer_of(&name))
            else {
                continue; // not a pin
            };
            if writer == own {
                continue;
            }
            let entry = latest
                .entry(writer.to_string())
                .or_insert((epoch, name.clone()));
            if (epoch, &name) > (entry.0, &entry.1) {
                *entry = (epoch, name);
            }
        }
        let mut behind = 0;
        for (epoch, name) in latest.into_values() {
            if epoch + 1 != newest {
                continue;
            }
            let not_waited_for = match self.store.get(&name) {
                // Not waited for: this process's other handles (tests open
                // several), which cannot look while this one waits; a
                // writer that holds no container or object (an idle
                // server's pin holds only its id range: nothing a
                // collection condemns); and a pin that does not decode,
                // which withholds deletion anyway.
                Ok(bytes) => PinRecord::decode(&name, &bytes).map_or(true, |pin| {
                    pin.process == crate::process::tag()
                        || crate::process::tag_is_dead_here(&pin.process)
                        || (pin.containers.is_empty() && pin.objects.is_empty())
                }),
                // Replaced by a newer pin, or its writer closed: the next
                // listing tells.
                Err(Error::NotFound { .. }) => false,
                // A damaged pin withholds deletion anyway.
                Err(Error::Corrupt { .. }) => true,
                Err(e) => return Err(e.into()),
            };
            if !not_waited_for {
                behind += 1;
            }
        }
        Ok(behind)
    }
}
