//! The test bucket, for the tests that need a real S3 service.

use dedup_store::RepoLocation;

/// A fresh prefix in the test bucket, unique to this run and `test`;
/// `None` (after saying why) when no S3 service is configured.
pub fn bucket_prefix(test: &str) -> Option<RepoLocation> {
    let Ok(base) = std::env::var("DEDUP_TEST_S3") else {
        if std::env::var_os("DEDUP_REQUIRE_S3").is_some() {
            panic!(
                "DEDUP_REQUIRE_S3 is set but DEDUP_TEST_S3 is not: start scripts/s3-test-server"
            );
        }
        eprintln!("{test}: skipped: no S3 service (set DEDUP_TEST_S3, see scripts/s3-test-server)");
        return None;
    };
    let nonce: u64 = rand::random();
    let url = format!("{base}/t-{nonce:016x}/{test}");
    Some(url.parse().expect("DEDUP_TEST_S3 is s3://BUCKET"))
}
