//! A clock for polling paths. `Instant::now` is CLOCK_MONOTONIC, which the vDSO answers without a
//! system call only when the clocksource has a user-readable counter (the TSC); in a VM on HPET or
//! ACPI PM timers, and in the Soft-RoCE test guest, every read is a system call, and a polling
//! loop that looks at the clock on each round makes hundreds of them per message. The coarse clock
//! (CLOCK_MONOTONIC_COARSE) is the kernel's last tick, copied into the vDSO page: read without a
//! system call on every clocksource, at tick resolution (1-10 ms), which is what liveness checks
//! every 10 ms and timeouts of seconds need.

use std::time::Duration;

/// Milliseconds on the coarse monotonic clock (from an arbitrary start).
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a local timespec that clock_gettime fills; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        // Not on this kernel (before 2.6.32): the precise clock, a system call or not.
        return fallback_ms();
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn fallback_ms() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// Whether at least `d` has passed on the coarse clock since `since_ms` (from [`coarse_ms`]).
pub fn coarse_elapsed(since_ms: u64, d: Duration) -> bool {
    coarse_ms().saturating_sub(since_ms) >= d.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_moves_forward_with_time() {
        let a = coarse_ms();
        std::thread::sleep(Duration::from_millis(50));
        let b = coarse_ms();
        // At tick resolution (at most 10 ms at HZ=100): 50 ms sleep shows as at least 30.
        assert!(b >= a + 30, "coarse clock went from {a} to {b} ms over a 50 ms sleep");
        assert!(coarse_elapsed(a, Duration::from_millis(30)));
        assert!(!coarse_elapsed(b, Duration::from_secs(3600)));
    }
}
