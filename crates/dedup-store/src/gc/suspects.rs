//! What a damaged backup object may still need. Its bytes name its recipe
//! and tree, so while one does not read, the collection cannot tell which
//! of the unnamed recipes and trees written for its name
//! (`recipes/<name>-<nonce>`, as every writer names them) is its. It keeps
//! every recipe, recipe part and tree no readable backup names that was
//! written for a damaged backup's name (they are the *suspects*), and
//! treats every segment they reference as live, so nothing the damaged
//! backup may reference is deleted or compacted away: a repaired (or
//! rewritten) backup object restores as before. Other unnamed objects
//! (a deleted backup's recipe, which `delete` leaves to the collection)
//! are orphans as always. If a suspect recipe cannot be read either, what
//! it references is unknown, and no container is deleted or compacted at
//! all in that collection.

use crate::backup::RECIPES_PREFIX;
use crate::error::repo::RepoError;
use crate::gc::marks::Marks;
use crate::recipe::parts::{part_of, RecipeObject};
use crate::recipe::Recipe;
use crate::repo::Repository;

/// The suspects' references.
pub(super) struct Suspects {
    /// Every segment the readable suspect recipes reference.
    pub marks: Marks,
    /// A suspect recipe (or part) did not read: containers are not
    /// deleted or compacted.
    pub unknown: bool,
}

impl Repository {
    /// Mark what the suspect `objects` (recipes, parts and trees no
    /// readable backup names) reference. Each recipe object and part is
    /// read on its own: an index's parts are among the suspects too.
    pub(super) fn mark_suspects(&self, objects: &[&str]) -> Suspects {
        let mut out = Suspects {
            marks: Marks::new(""),
            unknown: false,
        };
        for &object in objects.iter().filter(|o| o.starts_with(RECIPES_PREFIX)) {
            let read = self.store.get(object).map_err(RepoError::from);
            let recipe = match part_of(object) {
                Some(_) => read.and_then(|b| Recipe::decode(object, &b)),
                None => match read.and_then(|b| RecipeObject::decode(object, &b)) {
                    Ok(RecipeObject::Whole(r)) => Ok(r),
                    // Its parts are suspects of their own.
                    Ok(RecipeObject::Index(_)) => continue,
                    Err(e) => Err(e),
                },
            };
            match recipe {
                Ok(r) => out.marks.mark(&r),
                Err(_) => out.unknown = true,
            }
        }
        out
    }
}
