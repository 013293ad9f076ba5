//! Credentials and region from the AWS tools' shared files, as `aws`,
//! restic and rclone read them: `AWS_PROFILE` (or `default`) in
//! `~/.aws/credentials` (`AWS_SHARED_CREDENTIALS_FILE`) and `~/.aws/config`
//! (`AWS_CONFIG_FILE`, where the section is `[profile NAME]`). The
//! `object_store` crate reads only the environment, so this fills in what
//! the environment leaves unset; a variable always wins over a file.

use std::path::{Path, PathBuf};

use ini::Ini;

use crate::error::{Error, Result};

/// What one profile of the shared files holds (each `None` if unset).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// The profile `AWS_PROFILE` names (or `default`) from the shared files
/// the environment points at. `None` when no profile was asked for and
/// the files hold no `default`; an `AWS_PROFILE` that neither file holds
/// is an error naming it.
pub fn from_environment() -> Result<Option<Profile>> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(default)))
    };
    let asked = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    read(
        asked.as_deref(),
        file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials").as_deref(),
        file("AWS_CONFIG_FILE", ".aws/config").as_deref(),
    )
}

/// `from_environment` with the names and paths given.
pub fn read(
    asked: Option<&str>,
    credentials: Option<&Path>,
    config: Option<&Path>,
) -> Result<Option<Profile>> {
    let name = asked.unwrap_or("default");
    let load = |path: Option<&Path>| -> Result<Option<Ini>> {
        let Some(path) = path.filter(|p| p.exists()) else {
            return Ok(None);
        };
        Ini::load_from_file(path).map(Some).map_err(|e| {
            Error::InvalidArgument(format!(
                "reading the AWS shared file {}: {e}",
                path.display()
            ))
        })
    };
    let credentials = load(credentials)?;
    let config = load(config)?;
    // The config file names its sections `profile NAME`, except `default`.
    let config_section = if name == "default" {
        "default".to_string()
    } else {
        format!("profile {name}")
    };
    let from_credentials = credentials.as_ref().and_then(|i| i.section(Some(name)));
    let from_config = config
        .as_ref()
        .and_then(|i| i.section(Some(config_section.as_str())));
    if from_credentials.is_none() && from_config.is_none() {
        return match asked {
            Some(name) => Err(Error::InvalidArgument(format!(
                "AWS_PROFILE is {name:?}, but neither the shared credentials file nor the config file (~/.aws/credentials, ~/.aws/config, or AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE) has that profile"
            ))),
            None => Ok(None),
        };
    }
    let get = |key: &str| {
        from_credentials
            .and_then(|s| s.get(key))
            .or_else(|| from_config.and_then(|s| s.get(key)))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Ok(Some(Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: get("region"),
        endpoint_url: get("endpoint_url"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(credentials: &str, config: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (c, f) = (dir.path().join("credentials"), dir.path().join("config"));
        std::fs::write(&c, credentials).unwrap();
        std::fs::write(&f, config).unwrap();
        (dir, c, f)
    }

    const CREDENTIALS: &str = "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = sdefault\n\n[backup]\naws_access_key_id=AKBACKUP\naws_secret_access_key=sbackup\naws_session_token = tok\n";
    const CONFIG: &str = "[default]\nregion = eu-west-1\n\n[profile backup]\nregion = us-east-2\nendpoint_url = http://127.0.0.1:8333\n\n[profile only-config]\naws_access_key_id = AKCONF\naws_secret_access_key = sconf\n";

    #[test]
    fn a_named_profile_joins_both_files() {
        let (_d, c, f) = files(CREDENTIALS, CONFIG);
        let p = read(Some("backup"), Some(&c), Some(&f)).unwrap().unwrap();
        assert_eq!(
            p,
            Profile {
                access_key_id: Some("AKBACKUP".into()),
                secret_access_key: Some("sbackup".into()),
                session_token: Some("tok".into()),
                region: Some("us-east-2".into()),
                endpoint_url: Some("http://127.0.0.1:8333".into()),
            }
        );
        let p = read(Some("only-config"), Some(&c), Some(&f))
            .unwrap()
            .unwrap();
        assert_eq!(p.access_key_id.as_deref(), Some("AKCONF"));
    }

    #[test]
    fn without_aws_profile_the_default_is_used_if_there_is_one() {
        let (_d, c, f) = files(CREDENTIALS, CONFIG);
        let p = read(None, Some(&c), Some(&f)).unwrap().unwrap();
        assert_eq!(p.access_key_id.as_deref(), Some("AKDEFAULT"));
        assert_eq!(p.region.as_deref(), Some("eu-west-1"));
        let (_d, c, f) = files("[other]\n", "");
        assert_eq!(read(None, Some(&c), Some(&f)).unwrap(), None);
        assert_eq!(read(None, None, None).unwrap(), None);
    }

    #[test]
    fn a_profile_no_file_holds_is_an_error_naming_it() {
        let (_d, c, f) = files(CREDENTIALS, CONFIG);
        let e = read(Some("nope"), Some(&c), Some(&f))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"nope\"") && e.contains("~/.aws/credentials"),
            "{e}"
        );
        let e = read(Some("nope"), None, None).unwrap_err().to_string();
        assert!(e.contains("\"nope\""), "{e}");
    }

    #[test]
    fn a_broken_file_is_named() {
        let (_d, c, f) = files("[default\naws_access_key_id = x\n", "");
        let e = read(None, Some(&c), Some(&f)).unwrap_err().to_string();
        assert!(e.contains("credentials"), "{e}");
    }
}
