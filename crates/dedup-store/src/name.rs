//! Object names: what a store accepts as a key. The same names must work as
//! relative paths under a local directory and as S3 keys, so they are kept to
//! a small alphabet, `/`-separated components, none empty, none starting with
//! `.` (which also rules out `.` and `..`). `LocalDir`'s temporary files start
//! with `.`, so no valid name can ever be one of them, and listing skips them.

use crate::error::{Error, Result};

/// Longest name accepted (S3 keys may be 1024 bytes; Linux file names 255).
pub const MAX_NAME_LEN: usize = 255;

/// Check that `name` is a valid object name; the error names it and says why.
pub fn validate(name: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(Error::BadName {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad(&format!("it is longer than {MAX_NAME_LEN} bytes"));
    }
    if let Some(c) = name.chars().find(|&c| !is_name_char(c) && c != '/') {
        return bad(&format!(
            "it holds {c:?}; names use only A-Z a-z 0-9 . _ - and / between components"
        ));
    }
    if name.starts_with('/') {
        return bad("it is absolute (starts with /)");
    }
    for component in name.split('/') {
        if component.is_empty() {
            return bad("it has an empty component (// or a trailing /)");
        }
        if component.starts_with('.') {
            return bad("a component starts with '.' (no ., .. or hidden names)");
        }
    }
    Ok(())
}

/// The characters allowed inside one component.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_pass_and_bad_ones_are_named() {
        for good in ["a", "containers/00000000000000ff", "x/y.z_w-1"] {
            validate(good).unwrap();
        }
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            ".hidden",
            "a//b",
            "a/",
            "sp ace",
            "uni\u{e9}",
            "back\\slash",
        ] {
            let e = validate(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(validate(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
