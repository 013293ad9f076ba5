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
            format!(
                "the storage engine failed on damaged data ({why}); {}",
                crate::backends::NOT_REBUILT
            ),
        )
    }

    pub fn run<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(why) = &self.poisoned {
            return Err(self.error(why));
        }
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(panic) => {
                let why = crate::error::panic_message(panic.as_ref());
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

/// An engine that is only ever used under its `Guard`.
pub struct Guarded<T> {
    engine: Option<T>,
    guard: Guard,
}

impl<T> Guarded<T> {
    /// Build the engine under a guard of its own.
    pub fn open(structure: &'static str, build: impl FnOnce() -> Result<T>) -> Result<Guarded<T>> {
        let mut guard = Guard::new(structure);
        let engine = guard.run(build)?;
        Ok(Guarded {
            engine: Some(engine),
            guard,
        })
    }

    pub fn with<R>(&mut self, f: impl FnOnce(&mut T) -> Result<R>) -> Result<R> {
        let Guarded { engine, guard } = self;
        match engine.as_mut() {
            Some(e) => guard.run(|| f(e)),
            None => Err(Error::corrupt(
                guard.structure,
                "the storage engine is closed",
            )),
        }
    }

    /// The engine, for read-only peeks (statistics); None once poisoned or closed.
    pub fn peek(&self) -> Option<&T> {
        self.engine.as_ref().filter(|_| !self.guard.is_poisoned())
    }

    /// Shut the engine down now (guarded), e.g. so its files stop changing.
    pub fn close(&mut self) {
        let engine = self.engine.take();
        self.guard.drop_engine(engine);
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        self.close();
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
