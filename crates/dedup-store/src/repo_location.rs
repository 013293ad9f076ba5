//! Where a repository lives, as every command's `REPO` names it: a local
//! directory, or `s3://BUCKET/PREFIX` on S3 or a service that speaks it.
//!
//! Anything else that looks like a URL (`scheme://...`) is refused, never
//! taken for a directory name: `dedup store init s3:/b` or `gs://b/x` must
//! not quietly make a local directory called `s3:` or `gs:`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::local::LocalDir;
use crate::name::validate;
use crate::objects::ObjectStore;
use crate::s3::S3Store;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepoLocation {
    Dir(PathBuf),
    S3 { bucket: String, prefix: String },
}

impl RepoLocation {
    /// The local directory, for a repository that has one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            RepoLocation::Dir(dir) => Some(dir),
            RepoLocation::S3 { .. } => None,
        }
    }

    /// The object store holding the repository's objects: a directory is
    /// created (0700) if missing; a bucket must exist.
    pub fn open_store(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(match self {
            RepoLocation::Dir(dir) => Arc::new(LocalDir::open(dir)?),
            RepoLocation::S3 { bucket, prefix } => Arc::new(S3Store::open(bucket, prefix)?),
        })
    }
}

impl fmt::Display for RepoLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RepoLocation::Dir(dir) => write!(f, "{}", dir.display()),
            RepoLocation::S3 { bucket, prefix } => {
                f.write_str(&crate::s3::location_url(bucket, prefix))
            }
        }
    }
}

impl From<&Path> for RepoLocation {
    fn from(dir: &Path) -> RepoLocation {
        RepoLocation::Dir(dir.to_path_buf())
    }
}

impl From<&PathBuf> for RepoLocation {
    fn from(dir: &PathBuf) -> RepoLocation {
        RepoLocation::Dir(dir.clone())
    }
}

impl From<&RepoLocation> for RepoLocation {
    fn from(location: &RepoLocation) -> RepoLocation {
        location.clone()
    }
}

impl From<PathBuf> for RepoLocation {
    fn from(dir: PathBuf) -> RepoLocation {
        RepoLocation::Dir(dir)
    }
}

impl FromStr for RepoLocation {
    type Err = Error;

    fn from_str(s: &str) -> Result<RepoLocation> {
        let bad = |reason: String| Error::InvalidArgument(format!("repository {s:?}: {reason}"));
        // A URL's scheme is a letter, then letters, digits, + . or -.
        let url = s.split_once("://").filter(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
        });
        let Some((scheme, rest)) = url else {
            if s.is_empty() {
                return Err(bad("empty; give a directory or s3://BUCKET/PREFIX".into()));
            }
            return Ok(RepoLocation::Dir(PathBuf::from(s)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                check_bucket(bucket).map_err(bad)?;
                let prefix = prefix.trim_end_matches('/');
                if !prefix.is_empty() {
                    validate(prefix).map_err(|e| bad(format!("the prefix: {e}")))?;
                }
                Ok(RepoLocation::S3 {
                    bucket: bucket.to_string(),
                    prefix: prefix.to_string(),
                })
            }
            "file" if rest.starts_with('/') => Ok(RepoLocation::Dir(PathBuf::from(rest))),
            "file" => Err(bad("a file:// URL needs an absolute path (file:///…)".into())),
            _ => Err(bad(format!(
                "{scheme}:// is not a kind of repository dedup knows; give a directory or s3://BUCKET/PREFIX (for a directory whose name holds ://, write it as ./{s})"
            ))),
        }
    }
}

/// S3's bucket naming rules, so a typo is named here and not by a 400.
fn check_bucket(bucket: &str) -> std::result::Result<(), String> {
    if bucket.is_empty() {
        return Err("no bucket; give s3://BUCKET or s3://BUCKET/PREFIX".into());
    }
    if !(3..=63).contains(&bucket.len()) {
        return Err(format!("bucket {bucket:?} must be 3 to 63 characters"));
    }
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if !bucket.chars().all(ok) {
        return Err(format!(
            "bucket {bucket:?} may hold only a-z, 0-9, '-' and '.'"
        ));
    }
    let edge = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !bucket.starts_with(edge) || !bucket.ends_with(edge) {
        return Err(format!(
            "bucket {bucket:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, prefix: &str) -> RepoLocation {
        RepoLocation::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn directories_and_s3_urls_parse_and_print_back() {
        for (text, want, shown) in [
            ("repo", RepoLocation::Dir("repo".into()), "repo"),
            (
                "/var/backups/r",
                RepoLocation::Dir("/var/backups/r".into()),
                "/var/backups/r",
            ),
            ("./s3://x", RepoLocation::Dir("./s3://x".into()), "./s3://x"),
            (
                "file:///srv/r",
                RepoLocation::Dir("/srv/r".into()),
                "/srv/r",
            ),
            ("s3://bucket", s3("bucket", ""), "s3://bucket"),
            ("s3://bucket/", s3("bucket", ""), "s3://bucket"),
            (
                "s3://my.bucket-1/hosts/a",
                s3("my.bucket-1", "hosts/a"),
                "s3://my.bucket-1/hosts/a",
            ),
            ("S3://bucket/x/", s3("bucket", "x"), "s3://bucket/x"),
        ] {
            let got: RepoLocation = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn unknown_schemes_and_bad_buckets_are_refused_by_name() {
        for (text, says) in [
            ("gs://bucket/x", "gs:// is not a kind of repository"),
            ("http://host/x", "http:// is not a kind"),
            ("s3://", "no bucket"),
            ("s3:///x", "no bucket"),
            ("s3://ab", "3 to 63"),
            ("s3://Bucket", "only a-z"),
            ("s3://b_c_d", "only a-z"),
            ("s3://-bucket", "start and end"),
            ("s3://bucket/a//b", "the prefix"),
            ("s3://bucket/.hidden", "the prefix"),
            ("file://relative", "absolute path"),
            ("", "empty"),
        ] {
            let e = text.parse::<RepoLocation>().unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
