//! The staging engine's unit tests: size classes, chunks, the pool and its cap, the host copier.

use super::copy::{class_of, MIN_CLASS};
use super::*;

#[test]
fn size_classes() {
    assert_eq!(class_of(0), MIN_CLASS);
    assert_eq!(class_of(4096), 12);
    assert_eq!(class_of(4097), 13);
    assert_eq!(class_of(1 << 20), 20);
    assert_eq!(class_of((1 << 20) + 1), 21);
}

#[test]
fn chunks() {
    let c = Chunks::split(0);
    assert_eq!((c.n, c.ready()), (0, 0));
    let c = Chunks::split(1000);
    assert_eq!((c.n, c.ends[0]), (1, 1000));
    let c = Chunks::split(2 * CHUNK_MIN);
    assert_eq!((c.n, c.ends[0], c.ends[1]), (2, CHUNK_MIN, 2 * CHUNK_MIN));
    let mut c = Chunks::split(16 << 20);
    assert_eq!(c.n, MAX_CHUNKS);
    assert_eq!(c.ends, [4 << 20, 8 << 20, 12 << 20, 16 << 20]);
    c.done = 2;
    assert_eq!(c.ready(), 8 << 20);
    let c = Chunks::split(3 * CHUNK_MIN + 5);
    assert_eq!(c.n, 3);
    assert_eq!(c.ends[2], 3 * CHUNK_MIN + 5);
    assert!(c.ends[0] % 4096 == 0 && c.ends[0] < c.ends[1] && c.ends[1] < c.ends[2]);
}

/// The pool keeps at most RIVET_STAGING_POOL_MAX of unused buffers after a burst of random
/// sizes (here up to 8 MiB, cap 16 MiB), freeing the largest first, and frees nothing while a
/// copy of its copier is still to run.
#[test]
fn the_pool_keeps_no_more_than_its_cap() {
    use super::copy::{NoRegistration, Pool};
    let cap = 16 << 20;
    let mut pool = Pool::default();
    let mut c = HostCopier::new();
    let reg = NoRegistration;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut peak = 0;
    for _round in 0..4 {
        let mut burst = Vec::new();
        for _ in 0..24 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            burst.push(pool.get((x % (8 << 20)) as usize + 1, &mut c, &reg).unwrap());
        }
        peak = peak.max(pool.bytes);
        for b in burst {
            pool.put(b);
            pool.trim(cap, &reg, &mut c);
            assert!(pool.idle <= cap, "{} unused bytes kept, cap {cap}", pool.idle);
        }
    }
    assert!(peak > 2 * cap, "the bursts exceed the cap ({peak} bytes at the peak)");
    assert!(pool.bytes <= cap, "{} bytes left allocated after the bursts", pool.bytes);
    // A copy still to run: nothing is freed, whatever the cap says.
    let b = pool.get(1 << 20, &mut c, &reg).unwrap();
    let mut dst = [0u8; 8];
    let src = [1u8; 8];
    // SAFETY: both arrays outlive the copier, which never runs this copy (it is dropped
    // unfenced with the copier at the end of the test).
    unsafe { c.to_host(dst.as_mut_ptr(), src.as_ptr() as usize, 8).unwrap() };
    pool.put(b);
    let before = pool.idle;
    assert_eq!(pool.trim(0, &reg, &mut c), 0, "freed while a copy was pending");
    assert_eq!(pool.idle, before);
    c.fence(1).unwrap();
    while !c.reached(1).unwrap() {}
    assert!(pool.trim(0, &reg, &mut c) > 0 && pool.idle == 0, "cap 0 keeps nothing once the copies are done");
    assert_eq!(dst, [1u8; 8]);
    pool.clear(&reg, &mut c);
}

#[test]
fn host_copier_completes_one_poll_late() {
    let mut c = HostCopier::new();
    let src = [7u8; 16];
    let mut dst = [0u8; 16];
    // SAFETY: both arrays outlive the copier's use of them (checked below).
    unsafe { c.to_host(dst.as_mut_ptr(), src.as_ptr() as usize, 16).unwrap() };
    c.fence(3).unwrap();
    assert_eq!(dst, [0; 16], "nothing copied before the fence is polled");
    assert!(!c.reached(3).unwrap());
    assert_eq!(dst, [7; 16]);
    assert!(c.reached(3).unwrap());
}
