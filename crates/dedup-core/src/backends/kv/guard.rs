//! Containment for third-party storage engines. redb and fjall validate what
//! they read, but on some damaged inputs they panic instead of returning an
//! error. A panic must not take the server down (nbdkit aborts on one) nor
//! ever let damaged metadata be used, so every call into an engine runs
//! under `Guard::run`: a panic becomes a `Corrupt` error, and the engine is
//! treated as poisoned from then on (every later call fails the same way,
//! and it is never dropped, since its destructor may panic on poisoned locks).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result};

pub struct Guard {
    structure: &'static str,
    poisoned: Option<String>,
}

impl Guard {
    pub fn new(structure: &'static str) -> Guard {
        Guard {
            structure,
            poisoned: None,
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    fn error(&self, why: &str) -> Error {
        Error::corrupt(
            self.structure,
            format!("the storage engine failed on damaged data ({why}); run `dedup check` on a stopped device"),
        )
    }

    pub fn run<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(why) = &self.poisoned {
            return Err(self.error(why));
        }
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string());
                tracing::error!("{}: storage engine panicked: {why}", self.structure);
                let e = self.error(&why);
                self.poisoned = Some(why);
                Err(e)
            }
        }
    }
}

impl Guard {
    /// Shut an engine down: its destructor may panic on damaged data too, so
    /// it runs guarded; a poisoned engine (or one dropped while a panic is
    /// already unwinding) is leaked instead, as a second panic would abort.
    pub fn drop_engine<T>(&mut self, engine: Option<T>) {
        if self.is_poisoned() || std::thread::panicking() {
            std::mem::forget(engine);
        } else if catch_unwind(AssertUnwindSafe(|| drop(engine))).is_err() {
            tracing::error!(
                "{}: storage engine panicked while shutting down",
                self.structure
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_poisons_the_guard() {
        let mut g = Guard::new("test tables");
        assert_eq!(g.run(|| Ok(5)).unwrap(), 5);
        let e = g.run::<()>(|| panic!("boom")).unwrap_err().to_string();
        assert!(e.contains("test tables") && e.contains("boom"), "{e}");
        assert!(g.is_poisoned());
        assert!(g.run(|| Ok(1)).is_err(), "poisoned for good");
    }
}
