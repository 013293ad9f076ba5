//! Write-back's admission alone: `submit` against a device whose room the
//! test sets, with no appliers, so nothing queued is applied behind the
//! test's back.

use std::cell::Cell;

use super::*;

const CS: u64 = 4096;

/// A device as `submit` sees it, alone with one client.
struct Fake {
    room: Cell<u64>,
    commit_room: Cell<Option<u64>>,
}

impl Admission for Fake {
    fn room(&self) -> u64 {
        self.room.get()
    }
    fn alone(&self) -> bool {
        true
    }
    fn others_need(&self, _own: u64) -> u64 {
        0
    }
    fn commit_room(&self) -> Option<u64> {
        self.commit_room.get()
    }
}

/// A queue over a device with `room` free chunks and no commit running.
fn queue_with_room(room: u64) -> (WriteBack, Fake) {
    let wb = WriteBack::unstarted(1 << 20, 0, CS, "the test".into());
    let ask = Fake {
        room: Cell::new(room),
        commit_room: Cell::new(None),
    };
    (wb, ask)
}

fn write(wb: &WriteBack, ask: &Fake, chunks: u64, buf: &[u8]) -> Admit {
    let req = Request {
        what: Mutation::Write,
        offset: 0,
        len: chunks * CS,
        buf,
    };
    wb.submit(req, ask)
}

/// A write refused a commit's room is applied directly; once it has taken
/// the device's last free chunk, the next write must not be queued
/// against the room read before it (an acknowledged write would then find
/// the device full). Found by the model test: the applier of the previous
/// write was committing when a large write arrived.
#[test]
fn a_direct_write_during_a_commit_uses_up_the_spare_room() {
    let (wb, ask) = queue_with_room(2);
    let buf = vec![7u8; 7 * CS as usize];
    // Room read: 2 chunks; one queued, one spare.
    assert!(matches!(
        write(&wb, &ask, 1, &buf[..CS as usize]),
        Admit::Queued
    ));
    // A commit holds the gate: seven chunks do not fit what it saw.
    ask.commit_room.set(Some(2));
    let Admit::Direct { held, .. } = write(&wb, &ask, 7, &buf) else {
        panic!("a write larger than the commit's room must be applied directly");
    };
    // It applies, taking the spare chunk, and the commit ends.
    ask.room.set(1);
    wb.done_direct(held);
    ask.commit_room.set(None);
    // One chunk is free and the queued write holds it.
    assert!(
        matches!(
            write(&wb, &ask, 1, &buf[..CS as usize]),
            Admit::Direct { .. }
        ),
        "queued with no chunk left for it"
    );
}

/// The same for a trim that passes a stall: it may need new chunks for
/// its partial ends, so the room it holds is not spare either.
#[test]
fn a_trim_past_a_stall_uses_up_the_spare_room() {
    let (wb, ask) = queue_with_room(2);
    let buf = vec![7u8; CS as usize];
    assert!(matches!(write(&wb, &ask, 1, &buf), Admit::Queued));
    wb.shared.state.lock().stalled = Some(Stall {
        seq: 0,
        what: "a test stall".into(),
        errno: libc::EIO,
        retry_at: Instant::now(),
        pause: FIRST_RETRY_PAUSE,
    });
    let trim = Request {
        what: Mutation::Discard,
        offset: 10 * CS + 1,
        len: 10,
        buf: &[],
    };
    let Admit::Direct { held, .. } = wb.submit(trim, &ask) else {
        panic!("a trim is never queued behind a stall");
    };
    assert_eq!(held, 1);
    assert_eq!(wb.shared.state.lock().spare, 0, "the trim's chunk is held");
    wb.done_direct(held);
}
