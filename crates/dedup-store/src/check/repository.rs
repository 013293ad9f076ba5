//! `Repository::check`: the store check (`check.rs`) of an open
//! repository. Kept to the repository's object store so the check never
//! depends on (or disturbs) what the open handle caches.

use crate::check::{check, CheckOptions, CheckProgress, CheckReport};
use crate::error::repo::RepoResult;
use crate::repo::Repository;

impl Repository {
    /// Check every object of the repository (see [`check`]); writes nothing.
    pub fn check(
        &self,
        opts: CheckOptions,
        progress: &dyn Fn(CheckProgress),
    ) -> RepoResult<CheckReport> {
        check(&*self.object_store(), opts, progress)
    }
}
