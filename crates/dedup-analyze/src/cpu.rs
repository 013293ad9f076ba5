//! The calling thread's CPU time: what "CPU seconds" in the report mean.
//! A wall clock would count time spent waiting for a core when readers
//! outnumber them.

use std::time::Duration;

/// CPU time this thread has used so far.
pub fn now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec on our stack; the clock id is a
    // constant every Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time this thread spends in `f`.
pub fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = now();
    let r = f();
    (r, now().saturating_sub(t0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_loop_uses_cpu_and_a_sleep_does_not() {
        let ((), busy) = super::time(|| {
            let mut x = 0u64;
            for i in 0..20_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        });
        let ((), idle) = super::time(|| std::thread::sleep(std::time::Duration::from_millis(50)));
        assert!(busy > std::time::Duration::from_millis(1), "{busy:?}");
        assert!(idle < std::time::Duration::from_millis(10), "{idle:?}");
    }
}
