//! `S3Store`: the object-store seam on an S3 bucket, or on any service
//! that speaks S3 (SeaweedFS, MinIO, Ceph RGW), through the `object_store`
//! crate. A repository at `s3://BUCKET/PREFIX` keeps every object under
//! `PREFIX/`, named exactly as in a local directory.
//!
//! The seam's contract holds on S3 as on a disk:
//! - `put` never overwrites: every put is create-only (`If-None-Match: *`),
//!   and one always a single PUT (a multipart upload cannot be
//!   create-only). When a put's outcome is unknown (a timeout, a 5xx the
//!   crate's retries did not get past, a 412 on a retry of our own PUT),
//!   the object is read back: bytes equal to ours mean our put landed;
//!   other bytes mean another writer's, `Exists`; none, the put is tried
//!   again. So a put of exactly the bytes a name already holds answers
//!   `Ok` (it cannot be told from our own retried PUT); objects whose
//!   writers must be told apart (locks) hold a random token.
//! - Whether the service honours create-only puts at all is checked when
//!   a repository is opened to write (`probe_create_only`): one that
//!   overwrites is refused, never written to.
//! - A request may take up to `DEFAULT_TIMEOUT` (`AWS_TIMEOUT` sets
//!   another): a 16 MiB container on a slow uplink takes minutes.
//! - Requests that fail with 5xx, 429, 408 or `SlowDown` are retried by the
//!   crate with exponential backoff and jitter; at most `MAX_IN_FLIGHT`
//!   requests are in flight per store.
//! - `delete` of a missing object succeeds (S3 cannot tell): callers treat
//!   `NotFound` and `Ok` alike.
//!
//! Endpoint, region and credentials come the usual way: `AWS_ENDPOINT_URL`,
//! `AWS_REGION`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (or
//! `AWS_SESSION_TOKEN`, web identity, instance metadata), else
//! `AWS_PROFILE` in the shared files `~/.aws/credentials` and
//! `~/.aws/config` (`profile.rs`); `AWS_ALLOW_HTTP=true` for a loopback
//! test server; path-style requests unless
//! `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`.
//!
//! The store's callers are plain threads (rayon's, the server's), so each
//! call blocks on a small runtime of the store's own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::limit::LimitStore;
use object_store::path::Path;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};

use crate::error::{Error, Result};
use crate::name::validate;
use crate::objects::{whole_range, ObjectStore};

/// Requests in flight at once per store: enough to keep a restore's
/// ranged GETs and a backup's container PUTs busy without a burst of
/// hundreds that a service answers with `SlowDown`.
pub const MAX_IN_FLIGHT: usize = 16;

/// Tries of a put whose outcome was unknown and that had not landed.
const PUT_TRIES: u32 = 4;

/// A restore's reads of a container in sequence, in windows of this many
/// bytes (`read_windows.rs`): a request costs a service far more than a
/// few MiB more of one (SeaweedFS: about 3 ms of CPU a GET), and on AWS
/// each GET is billed.
const READ_GRANULE: u64 = 4 << 20;

/// Whether a PUT's body goes unsigned (`UNSIGNED-PAYLOAD`) to `endpoint`
/// (`"AWS"` for AWS's own, always HTTPS) unless `AWS_UNSIGNED_PAYLOAD`
/// says otherwise: over HTTPS, TLS already keeps the body from being
/// changed on the way, and signing it costs a SHA-256 of every byte sent
/// (0.6-0.75 of the client's 2.2 CPU-seconds for a unique GiB into
/// SeaweedFS), as restic's minio-go also skips over TLS. Over plain HTTP
/// (a loopback test server, `AWS_ALLOW_HTTP=true`) the signature is all
/// that holds the body, so it stays. Reads never had it: a GET's response
/// is not signed, and what comes back is checked by the store's own
/// checksums and, when encrypted, authenticated.
fn payload_unsigned_by_default(endpoint: &str) -> bool {
    !endpoint
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

/// How long one request may take unless `AWS_TIMEOUT` says otherwise (the
/// crate's own default, 30 s, fails a 16 MiB PUT below 4.5 Mbit/s).
pub const DEFAULT_TIMEOUT: &str = "15min";

pub struct S3Store {
    inner: Arc<dyn object_store::ObjectStore>,
    /// `""` or the prefix with a trailing `/`.
    prefix: String,
    /// `s3://BUCKET/PREFIX`, for messages.
    url: String,
    /// The service's endpoint as configured (`None` for a store made
    /// `over` another in a test).
    endpoint: Option<String>,
    runtime: tokio::runtime::Runtime,
    requests: Requests,
    /// This machine's copies of objects read by their listed tag, made
    /// at the first such read (`None`: no cache directory, or no endpoint).
    listed: std::sync::OnceLock<Option<listed_cache::ListedCache>>,
}

/// Requests sent, by kind (a list counts each page of up to 1,000 names;
/// the crate's own retries are not counted).
#[derive(Debug)]
pub struct Requests {
    pub put: AtomicU64,
    pub get: AtomicU64,
    pub head: AtomicU64,
    pub list: AtomicU64,
    pub delete: AtomicU64,
}

/// A snapshot of `Requests`, as reports show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    pub put: u64,
    pub get: u64,
    pub head: u64,
    pub list: u64,
    pub delete: u64,
}

impl Requests {
    const fn new() -> Requests {
        Requests {
            put: AtomicU64::new(0),
            get: AtomicU64::new(0),
            head: AtomicU64::new(0),
            list: AtomicU64::new(0),
            delete: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> RequestCounts {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RequestCounts {
            put: n(&self.put),
            get: n(&self.get),
            head: n(&self.head),
            list: n(&self.list),
            delete: n(&self.delete),
        }
    }
}

/// Every S3 store's requests in this process: what a command's `--json`
/// reports as the requests it sent.
static SENT: Requests = Requests::new();

/// The requests this process has sent to S3 so far.
pub fn requests_sent() -> RequestCounts {
    SENT.counts()
}

impl S3Store {
    /// The bucket `bucket`, objects under `prefix` (no leading or trailing
    /// `/`; empty for the whole bucket), configured from the environment.
    pub fn open(bucket: &str, prefix: &str) -> Result<S3Store> {
        let url = location_url(bucket, prefix);
        let timeout = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if builder.get_config_value(&timeout).is_none() {
            builder = builder.with_config(timeout, DEFAULT_TIMEOUT);
        }
        if let Some(p) = profile::from_environment()? {
            // The environment wins over the files, key by key.
            let unset = |b: &AmazonS3Builder, k| b.get_config_value(&k).is_none();
            let mut fill = |key: AmazonS3ConfigKey, value: Option<String>| {
                if let Some(value) = value.filter(|_| unset(&builder, key)) {
                    builder = std::mem::take(&mut builder).with_config(key, value);
                }
            };
            if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                fill(AmazonS3ConfigKey::AccessKeyId, p.access_key_id);
                fill(AmazonS3ConfigKey::SecretAccessKey, p.secret_access_key);
                fill(AmazonS3ConfigKey::Token, p.session_token);
            }
            fill(AmazonS3ConfigKey::Region, p.region);
            fill(AmazonS3ConfigKey::Endpoint, p.endpoint_url);
        }
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::Endpoint)
            .unwrap_or_else(|| "AWS".into());
        if builder
            .get_config_value(&AmazonS3ConfigKey::UnsignedPayload)
            .is_none()
            && payload_unsigned_by_default(&endpoint)
        {
            builder = builder.with_config(AmazonS3ConfigKey::UnsignedPayload, "true");
        }
        let s3 = builder
            .build()
            .map_err(|e| s3_error(&url, "configuring the S3 client for", e))?;
        let mut store = S3Store::over(Arc::new(LimitStore::new(s3, MAX_IN_FLIGHT)), prefix, url)?;
        store.endpoint = Some(endpoint);
        Ok(store)
    }

    /// A store over any `object_store` implementation: for tests (the
    /// crate's in-memory store, behind a layer that injects faults).
    pub fn over(
        inner: Arc<dyn object_store::ObjectStore>,
        prefix: &str,
        url: String,
    ) -> Result<S3Store> {
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            validate(prefix)?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dedup-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io(format!("starting the S3 client for {url}"), e))?;
        Ok(S3Store {
            inner,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            url,
            endpoint: None,
            runtime,
            requests: Requests::new(),
            listed: std::sync::OnceLock::new(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    fn key(&self, name: &str) -> Result<Path> {
        validate(name)?;
        Path::parse(format!("{}{name}", self.prefix)).map_err(|e| Error::BadName {
            name: name.to_string(),
            reason: e.to_string(),
        })
    }

    /// Count one request of the kind `pick` chooses, here and process-wide,
    /// and trace it (`DEDUP_LOG=dedup_store::s3=debug` shows every request,
    /// to see where an operation's requests go).
    fn count(&self, pick: fn(&Requests) -> &AtomicU64, kind: &str, name: &str) {
        tracing::debug!(target: "dedup_store::s3", "{kind} {name}");
        self.count_n(pick, 1);
    }

    fn count_n(&self, pick: fn(&Requests) -> &AtomicU64, n: u64) {
        pick(&self.requests).fetch_add(n, Ordering::Relaxed);
        pick(&SENT).fetch_add(n, Ordering::Relaxed);
    }

    /// The object's bytes in `range` (`None`: all), and its size.
    fn fetch(&self, name: &str, range: Option<GetRange>) -> Result<(Vec<u8>, u64)> {
        self.fetch_tagged(name, range)
            .map(|(bytes, size, _)| (bytes, size))
    }

    /// `fetch`, with the tag (ETag) the service gave the object it read.
    fn fetch_tagged(
        &self,
        name: &str,
        range: Option<GetRange>,
    ) -> Result<(Vec<u8>, u64, Option<String>)> {
        let key = self.key(name)?;
        self.count(|r| &r.get, "GET", name);
        let options = GetOptions {
            range,
            ..Default::default()
        };
        self.runtime.block_on(async {
            let got = self
                .inner
                .get_opts(&key, options)
                .await
                .map_err(|e| self.error(name, "reading", e))?;
            let size = got.meta.size;
            let tag = got.meta.e_tag.clone();
            let bytes = got
                .bytes()
                .await
                .map_err(|e| self.error(name, "reading", e))?;
            Ok((bytes.to_vec(), size, tag))
        })
    }

    fn try_put(&self, key: &Path, bytes: &[u8]) -> object_store::Result<()> {
        self.count(|r| &r.put, "PUT", key.as_ref());
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        self.runtime
            .block_on(self.inner.put_opts(key, payload, options))
            .map(|_| ())
    }

    /// After a put that may or may not have landed: `Some(Ok)` if the
    /// object holds `bytes`, `Some(Exists)` if it holds others, `None` if
    /// there is none. A failed read is the put's own error `failed`: what
    /// the user needs to know is that the put did not succeed.
    fn landed(
        &self,
        name: &str,
        bytes: &[u8],
        failed: &object_store::Error,
    ) -> Result<Option<Result<()>>> {
        match self.fetch(name, None) {
            Ok((there, _)) if there == bytes => Ok(Some(Ok(()))),
            Ok(_) => Ok(Some(Err(Error::Exists {
                name: name.to_string(),
            }))),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(s3_error(
                &self.url,
                &format!("writing object {name} (and reading it back: {e}) in"),
                clone_error(failed),
            )),
        }
    }

    /// An `object_store` error as the seam's: `NotFound` and `Exists`
    /// kept apart, the rest an I/O error naming the object and the URL.
    fn error(&self, name: &str, doing: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                name: name.to_string(),
            },
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => Error::Exists {
                name: name.to_string(),
            },
            other => s3_error(&self.url, &format!("{doing} object {name} in"), other),
        }
    }
}

impl ObjectStore for S3Store {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let key = self.key(name)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let unknown = match self.try_put(&key, bytes) {
                Ok(()) => return Ok(()),
                // Refused for good: retrying would only delay the error.
                Err(e) if is_definite(&e) => return Err(self.error(name, "writing", e)),
                // Another writer's, or our own from an attempt whose
                // answer was lost and which the crate then retried (read
                // back below); if there is none after all (a 409 from
                // racing conditional writes), it is tried again.
                Err(e) => e,
            };
            if let Some(outcome) = self.landed(name, bytes, &unknown)? {
                return outcome;
            }
            if tries >= PUT_TRIES {
                return Err(self.error(name, "writing", unknown));
            }
            std::thread::sleep(Duration::from_millis(100 << tries));
        }
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.fetch(name, None).map(|(bytes, _)| bytes)
    }

    /// From this machine's copy under `tag` if there is one; else read,
    /// and kept if the answer carries `tag` (`s3/listed_cache.rs`).
    fn get_listed(&self, name: &str, tag: &str) -> Result<Vec<u8>> {
        let cache = self.listed.get_or_init(|| {
            self.service()
                .and_then(|s| listed_cache::ListedCache::open(&s))
        });
        let Some(cache) = cache else {
            return self.get(name);
        };
        if let Some(bytes) = cache.get(name, tag) {
            return Ok(bytes);
        }
        let (bytes, _, got) = self.fetch_tagged(name, None)?;
        if got.as_deref() == Some(tag) && listed_cache::is_md5_of(tag, &bytes) {
            cache.put(name, tag, &bytes);
        }
        Ok(bytes)
    }

    fn forget_listed(&self, name: &str, tag: &str) {
        if let Some(Some(cache)) = self.listed.get() {
            cache.forget(name, tag);
        }
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        whole_range(name, offset, len, self.get_upto(name, offset, len)?)
    }

    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.get_tail_sized(name, len).map(|(bytes, _)| bytes)
    }

    fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        if len == 0 {
            return Ok((Vec::new(), self.size(name)?));
        }
        match self.fetch(name, Some(GetRange::Suffix(len))) {
            Ok((bytes, size)) => self.whole(name, bytes, len.min(size)).map(|b| (b, size)),
            // An empty object has no suffix to give: 416.
            Err(Error::Io { .. }) if self.size(name)? == 0 => Ok((Vec::new(), 0)),
            Err(e) => Err(e),
        }
    }

    /// One ranged GET: the service clamps a range that runs past the end
    /// and its `Content-Range` gives the size.
    fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
        let at_or_past_end = |size: u64| {
            if offset == size {
                Ok((Vec::new(), size))
            } else {
                Err(Error::out_of_range(name, offset, len, size))
            }
        };
        let end = offset.saturating_add(len);
        if len == 0 {
            let size = self.size(name)?;
            return if offset <= size {
                Ok((Vec::new(), size))
            } else {
                at_or_past_end(size)
            };
        }
        let got = match self.fetch(name, Some(GetRange::Bounded(offset..end))) {
            Ok(got) => got,
            // A range starting at or past the end: 416 from the service.
            Err(Error::Io { .. }) => {
                let size = self.size(name)?;
                if offset >= size {
                    return at_or_past_end(size);
                }
                self.fetch(name, Some(GetRange::Bounded(offset..end)))?
            }
            Err(e) => return Err(e),
        };
        let (bytes, size) = got;
        let expected = (end - offset).min(size.saturating_sub(offset));
        self.whole(name, bytes, expected).map(|b| (b, size))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.names(prefix, None)
    }

    fn list_sized(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        self.listing(prefix, None)
    }

    fn list_after(&self, prefix: &str, after: &str) -> Result<Vec<String>> {
        self.names(prefix, Some(after))
    }

    fn list_tagged(&self, prefix: &str) -> Result<Vec<(String, Option<String>)>> {
        Ok(self
            .listing_meta(prefix, None)?
            .into_iter()
            .map(|(name, meta)| (name, meta.e_tag))
            .collect())
    }

    /// By a HEAD request.
    fn size(&self, name: &str) -> Result<u64> {
        let key = self.key(name)?;
        self.count(|r| &r.head, "HEAD", name);
        self.runtime
            .block_on(self.inner.head(&key))
            .map(|meta| meta.size)
            .map_err(|e| self.error(name, "reading the size of", e))
    }

    fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
        crate::segment_hash::SegmentHash::PLAIN
    }

    fn read_granule(&self) -> u64 {
        READ_GRANULE
    }

    fn service(&self) -> Option<String> {
        Some(format!("{} {}", self.endpoint.as_deref()?, self.url))
    }

    fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name)?;
        self.count(|r| &r.delete, "DELETE", name);
        self.runtime
            .block_on(self.inner.delete(&key))
            .map_err(|e| self.error(name, "deleting", e))
    }
}

impl S3Store {
    /// `bytes`, if the service sent the `expected` many its answer's
    /// `Content-Range` promised: a body of another length is refused,
    /// never handed on to be sliced by a size it does not have.
    fn whole(&self, name: &str, bytes: Vec<u8>, expected: u64) -> Result<Vec<u8>> {
        if bytes.len() as u64 != expected {
            return Err(Error::io(
                format!("reading object {name} in {}", self.url),
                std::io::Error::other(format!(
                    "the service sent {} bytes where its answer promised {expected}",
                    bytes.len()
                )),
            ));
        }
        Ok(bytes)
    }

    /// `listing`'s names alone.
    fn names(&self, prefix: &str, after: Option<&str>) -> Result<Vec<String>> {
        Ok(self
            .listing(prefix, after)?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// The objects whose names start with `prefix` (and sort after
    /// `after`: S3's start-after, so the pages before it are never sent),
    /// sorted, with their sizes.
    fn listing(&self, prefix: &str, after: Option<&str>) -> Result<Vec<(String, u64)>> {
        Ok(self
            .listing_meta(prefix, after)?
            .into_iter()
            .map(|(name, meta)| (name, meta.size))
            .collect())
    }

    /// `listing` with each object's whole metadata.
    fn listing_meta(
        &self,
        prefix: &str,
        after: Option<&str>,
    ) -> Result<Vec<(String, object_store::ObjectMeta)>> {
        // The crate lists whole path components: list the directory the
        // prefix's full components name and filter by the rest.
        let dir = prefix.rsplit_once('/').map_or("", |(dir, _)| dir);
        if !dir.is_empty() && validate(dir).is_err() {
            return Ok(Vec::new()); // no valid name can lie below it
        }
        let full = format!("{}{dir}", self.prefix);
        let full = full.trim_end_matches('/');
        let under = (!full.is_empty())
            .then(|| Path::parse(full))
            .transpose()
            .map_err(|e| Error::BadName {
                name: prefix.to_string(),
                reason: e.to_string(),
            })?;
        let offset = after
            .map(|after| Path::parse(format!("{}{after}", self.prefix)))
            .transpose()
            .map_err(|e| Error::BadName {
                name: after.unwrap_or_default().to_string(),
                reason: e.to_string(),
            })?;
        self.count(|r| &r.list, "LIST", prefix);
        let stream = match &offset {
            Some(offset) => self.inner.list_with_offset(under.as_ref(), offset),
            None => self.inner.list(under.as_ref()),
        };
        let listed: Vec<object_store::ObjectMeta> = self
            .runtime
            .block_on(stream.try_collect())
            .map_err(|e| s3_error(&self.url, &format!("listing {prefix:?} in"), e))?;
        // One request per page of 1,000 names; the first is counted above.
        self.count_n(|r| &r.list, (listed.len() as u64).saturating_sub(1) / 1000);
        let mut names: Vec<(String, object_store::ObjectMeta)> = listed
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.as_ref().strip_prefix(&self.prefix)?;
                // Strangers (another tool's keys) are not objects.
                (name.starts_with(prefix)
                    && after.is_none_or(|after| name > after)
                    && validate(name).is_ok())
                .then(|| name.to_string())
                .map(|name| (name, meta))
            })
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(names)
    }
}

/// `s3://BUCKET/PREFIX` (or `s3://BUCKET`).
pub fn location_url(bucket: &str, prefix: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{prefix}")
    }
}

/// Errors a retry cannot mend: the service refused the request itself.
fn is_definite(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotImplemented { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::InvalidPath { .. }
    )
}

/// `object_store::Error` is not `Clone`: its message, kept as a generic
/// error, for a report that needs it twice.
fn clone_error(e: &object_store::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: e.to_string().into(),
    }
}

fn s3_error(url: &str, doing: &str, e: object_store::Error) -> Error {
    Error::io(
        format!("{doing} {url}"),
        std::io::Error::other(e.to_string()),
    )
}

mod listed_cache;
mod profile;

#[cfg(test)]
mod tests;
