//! The handles NCCL holds: tokens, not pointers.
//!
//! Every object handed to NCCL (a context, a listen comm, a send or receive comm, a memory
//! handle, a request) is named by a 64-bit token that only looks like a pointer: its kind, the
//! index of a slot in a table of that kind, the slot's generation, and for a request the request
//! slot of its comm. Slots live as long as the process (tables grow in chunks that are never
//! freed) and their generation changes when their object goes, so a stale handle (a comm NCCL
//! already closed, a request of it) or a foreign one (any other value) is found out by comparing
//! numbers: nothing is read through it, and nothing freed is ever read.
//!
//! Ownership is fixed here once per kind: a table owns its objects; NCCL's token lends access to
//! one for the length of a call, under the slot's lock; closing takes the object out.
//!
//! ```text
//!  63            40 39            16 15          3 2    0
//! +----------------+----------------+-------------+------+
//! | index + 1 (24) | generation (24)| request (13)| kind |
//! +----------------+----------------+-------------+------+
//! ```

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// What a token names. Never 0, so no token is NULL (nor NCCL's
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION`, 0x1, whose index field is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Ctx = 1,
    Listen = 2,
    SendComm = 3,
    RecvComm = 4,
    Mr = 5,
    Request = 6,
}

impl Kind {
    fn from_bits(b: u64) -> Option<Kind> {
        Some(match b {
            1 => Kind::Ctx,
            2 => Kind::Listen,
            3 => Kind::SendComm,
            4 => Kind::RecvComm,
            5 => Kind::Mr,
            6 => Kind::Request,
            _ => return None,
        })
    }
}

const KIND_BITS: u32 = 3;
const REQ_BITS: u32 = 13;
const GEN_BITS: u32 = 24;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Most request slots one comm may have.
pub const MAX_REQUESTS: usize = 1 << REQ_BITS;

/// A decoded token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub kind: Kind,
    index: u32,
    gen: u32,
    /// The request slot (requests only).
    pub req: u32,
}

impl Token {
    pub fn to_ptr(self) -> *mut std::ffi::c_void {
        let v = (self.kind as u64)
            | ((self.req as u64) << KIND_BITS)
            | (((self.gen & GEN_MASK) as u64) << (KIND_BITS + REQ_BITS))
            | (((self.index + 1) as u64) << (KIND_BITS + REQ_BITS + GEN_BITS));
        v as usize as *mut std::ffi::c_void
    }

    /// A token of any kind, or None for a value no table ever handed out.
    pub fn from_ptr(p: *mut std::ffi::c_void) -> Option<Token> {
        let v = p as usize as u64;
        let kind = Kind::from_bits(v & ((1 << KIND_BITS) - 1))?;
        let req = ((v >> KIND_BITS) & ((1 << REQ_BITS) - 1)) as u32;
        let gen = ((v >> (KIND_BITS + REQ_BITS)) & GEN_MASK as u64) as u32;
        let index = (v >> (KIND_BITS + REQ_BITS + GEN_BITS)).checked_sub(1)? as u32;
        if kind != Kind::Request && req != 0 {
            return None;
        }
        Some(Token { kind, index, gen, req })
    }

    /// A request's token, or None for any other value: `from_ptr` for the one kind every
    /// `test` takes, without the general decode's steps.
    #[inline(always)]
    pub fn request_from_ptr(p: *mut std::ffi::c_void) -> Option<Token> {
        let v = p as usize as u64;
        let hi = v >> (KIND_BITS + REQ_BITS + GEN_BITS);
        if v & ((1 << KIND_BITS) - 1) != Kind::Request as u64 || hi == 0 {
            return None;
        }
        let req = ((v >> KIND_BITS) & ((1 << REQ_BITS) - 1)) as u32;
        let gen = ((v >> (KIND_BITS + REQ_BITS)) & GEN_MASK as u64) as u32;
        Some(Token { kind: Kind::Request, index: (hi - 1) as u32, gen, req })
    }

    /// Whether two tokens name the same object (a comm and one of its requests do).
    pub fn same_object(self, other: Token) -> bool {
        (self.index, self.gen) == (other.index, other.gen)
    }

    /// The request `req` of the comm this token names.
    pub fn request(self, req: u32) -> Token {
        debug_assert!((req as usize) < MAX_REQUESTS);
        Token { kind: Kind::Request, req, ..self }
    }
}

const CHUNK: usize = 256;
const CHUNKS: usize = 4096;

/// A slot's state word: its generation, and whether a call holds its object or one panicked
/// holding it. One compare-and-swap from "this generation, free" to "this generation, held" checks
/// a token and locks its object at once (a `Mutex` beside the generation took a lock, two reads of
/// the generation and two of the panic count: about 75 instructions of every call NCCL makes).
const HELD: u32 = 1;
const POISONED: u32 = 2;
const GEN_SHIFT: u32 = 2;
/// A slot without an object: its generation field is the next object's generation with this bit
/// above it, a value no token's 24-bit generation matches.
const EMPTY: u32 = 1 << (GEN_SHIFT + GEN_BITS);

struct Slot<T> {
    state: AtomicU32,
    val: UnsafeCell<Option<T>>,
}

// SAFETY: `val` is only reached by whoever set HELD in `state` (one at a time, with Acquire and
// Release ordering on the state word, as a mutex), so a slot moves its object between threads as
// a `Mutex<Option<T>>` would.
unsafe impl<T: Send> Sync for Slot<T> {}

/// A table of objects of one kind (two kinds for comms: send and receive share one table).
pub struct Table<T> {
    chunks: [OnceLock<Box<[Slot<T>; CHUNK]>>; CHUNKS],
    free: Mutex<(Vec<u32>, u32)>,
}

/// Why a token names no object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Not a token of this table (another kind, or a value nobody handed out).
    Foreign,
    /// Its object was closed (or the slot now holds a newer one).
    Closed,
    /// An earlier call panicked while holding the object.
    Poisoned,
}

/// Access to one object, for the length of a call. Shared between threads only where the object
/// may be, as a `MutexGuard`:
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<nccl_net_rivet::handles::Guard<'static, std::cell::Cell<u8>>>();
/// ```
pub struct Guard<'a, T> {
    slot: &'a Slot<T>,
    /// The state word to leave behind: the generation, free.
    free: u32,
    /// Shared between threads only where `T` may be, as a `MutexGuard` (a slot is `Sync` for
    /// any `T: Send`: without this, two threads could call `&self` methods of one object at once).
    _excl: std::marker::PhantomData<&'a mut T>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the slot (HELD set by it), so nothing else reaches `val`.
        let v = unsafe { &*self.slot.val.get() };
        // `lock` only makes a guard of a slot that holds an object, and only `remove` (which
        // needs the slot held) takes it out.
        v.as_ref().expect("a guard holds an object")
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        let v = unsafe { &mut *self.slot.val.get() };
        v.as_mut().expect("a guard holds an object")
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // A call that panicked holding the object leaves it unusable (as a poisoned mutex; here
        // also a guard taken while unwinding, which nothing in rivet does: no `Drop` of a comm,
        // registration or listener reaches a table).
        let left = if std::thread::panicking() { self.free | POISONED } else { self.free };
        self.slot.state.store(left, Ordering::Release);
    }
}

impl<T> Slot<T> {
    /// Hold this slot while its generation is `gen` (any generation: None). Waits while another
    /// call holds it (a call's length: nothing in rivet holds a slot across a wait).
    fn lock(&self, gen: Option<u32>, poisoned_ok: bool) -> Result<u32, Stale> {
        let mut v = self.state.load(Ordering::Relaxed);
        let mut tries = 0u32;
        loop {
            if gen.is_some_and(|g| v >> GEN_SHIFT != g) {
                return Err(Stale::Closed);
            }
            if v & POISONED != 0 && !poisoned_ok {
                return Err(Stale::Poisoned);
            }
            if v & HELD == 0 {
                match self.state.compare_exchange_weak(v, v | HELD, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => return Ok(v),
                    Err(now) => {
                        v = now;
                        continue;
                    }
                }
            }
            // Held by another thread (NCCL's service thread registering memory on a comm the
            // proxy thread tests, say): spin briefly, then give the CPU away.
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            v = self.state.load(Ordering::Relaxed);
        }
    }
}

impl<T> Table<T> {
    pub const fn new() -> Table<T> {
        Table { chunks: [const { OnceLock::new() }; CHUNKS], free: Mutex::new((Vec::new(), 0)) }
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let c = self.chunks.get(index as usize / CHUNK)?.get()?;
        // A chunk is an array of CHUNK slots: no bounds check.
        Some(&c[index as usize % CHUNK])
    }

    /// Store `v`; the token names it as `kind` until `remove`. When the table is full, `v` comes
    /// back (for its owner to release what it holds, and say so).
    pub fn insert(&self, kind: Kind, v: T) -> Result<Token, T> {
        let index = {
            let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
            match f.0.pop() {
                Some(i) => i,
                None if (f.1 as usize) < CHUNK * CHUNKS => {
                    f.1 += 1;
                    f.1 - 1
                }
                None => return Err(v),
            }
        };
        let chunk = self.chunks[index as usize / CHUNK].get_or_init(|| {
            let slots: Box<[Slot<T>]> = (0..CHUNK).map(|_| Slot { state: AtomicU32::new(EMPTY | (1 << GEN_SHIFT)), val: UnsafeCell::new(None) }).collect();
            slots.try_into().unwrap_or_else(|_| unreachable!("CHUNK slots were made"))
        });
        let slot = &chunk[index as usize % CHUNK];
        // An empty slot: no token matches it, so nothing but a stale look (`check`) reaches it.
        let Ok(state) = slot.lock(None, true) else { unreachable!("lock of any generation") };
        // SAFETY: held (HELD set by `lock` above), released by the store below; writing an
        // `Option` over `None` runs no code that could panic in between.
        unsafe { *slot.val.get() = Some(v) };
        let gen = (state >> GEN_SHIFT) & GEN_MASK;
        slot.state.store(gen << GEN_SHIFT, Ordering::Release);
        Ok(Token { kind, index, gen, req: 0 })
    }

    fn check(&self, t: Token) -> Result<&Slot<T>, Stale> {
        let slot = self.slot(t.index).ok_or(Stale::Foreign)?;
        if slot.state.load(Ordering::Acquire) >> GEN_SHIFT != t.gen {
            return Err(Stale::Closed);
        }
        Ok(slot)
    }

    /// The object `t` names, held for the caller: one compare-and-swap when nobody else holds it
    /// (a slot whose generation is the token's holds an object: an empty one has EMPTY set).
    #[inline(always)]
    pub fn get(&self, t: Token) -> Result<Guard<'_, T>, Stale> {
        let slot = self.slot(t.index).ok_or(Stale::Foreign)?;
        let free = t.gen << GEN_SHIFT;
        match slot.state.compare_exchange_weak(free, free | HELD, Ordering::Acquire, Ordering::Relaxed) {
            // The generation is changed only with the slot held: it holds while we do.
            Ok(_) => Ok(Guard { slot, free, _excl: std::marker::PhantomData }),
            Err(_) => Self::get_slow(slot, t),
        }
    }

    /// `get` of a slot held by another call, closed, or poisoned.
    #[cold]
    #[inline(never)]
    fn get_slow(slot: &Slot<T>, t: Token) -> Result<Guard<'_, T>, Stale> {
        let state = slot.lock(Some(t.gen), false)?;
        Ok(Guard { slot, free: state, _excl: std::marker::PhantomData })
    }

    /// As `get`, but None instead of waiting when another call holds the object.
    pub fn try_get(&self, t: Token) -> Option<Guard<'_, T>> {
        let slot = self.slot(t.index)?;
        let free = t.gen << GEN_SHIFT;
        slot.state.compare_exchange(free, free | HELD, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(Guard { slot, free, _excl: std::marker::PhantomData })
    }

    /// Whether `t` still names an object (it may be held by a call right now).
    #[inline]
    pub fn live(&self, t: Token) -> bool {
        self.check(t).is_ok()
    }

    /// Take the object out: `t` and every token of it (its requests) are stale from now on.
    pub fn remove(&self, t: Token) -> Result<T, Stale> {
        let slot = self.check(t)?;
        // A poisoned object can still be closed (and its resources released).
        let state = slot.lock(Some(t.gen), true)?;
        // SAFETY: held (HELD set by `lock` above), released by the stores below; `take` runs no
        // code that could panic in between.
        let Some(v) = (unsafe { (*slot.val.get()).take() }) else {
            slot.state.store(state, Ordering::Release);
            return Err(Stale::Closed);
        };
        slot.state.store(EMPTY | ((t.gen + 1) & GEN_MASK) << GEN_SHIFT, Ordering::Release);
        self.free.lock().unwrap_or_else(|p| p.into_inner()).0.push(t.index);
        Ok(v)
    }
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_are_never_null_or_optional() {
        for (kind, index, gen, req) in [(Kind::Ctx, 0, 1, 0), (Kind::Request, (1 << 24) - 2, GEN_MASK, 8191), (Kind::Mr, 77, 5, 0)] {
            let t = Token { kind, index, gen, req };
            let p = t.to_ptr();
            assert!(!p.is_null() && p as usize != 1);
            assert_eq!(Token::from_ptr(p), Some(t));
            assert_eq!(Token::request_from_ptr(p), Some(t).filter(|t| t.kind == Kind::Request), "the request decode agrees");
        }
        for v in [0usize, 1, 6, (1 << 40) | 5, usize::MAX, (3 << 40) | (7 << 16) | (9 << 3) | 6] {
            let p = v as *mut std::ffi::c_void;
            assert_eq!(Token::request_from_ptr(p), Token::from_ptr(p).filter(|t| t.kind == Kind::Request), "{v:#x}");
        }
        assert_eq!(Token::from_ptr(std::ptr::null_mut()), None);
        assert_eq!(Token::from_ptr(1 as *mut _), None);
        // A real heap pointer is 8-aligned: kind bits 0, never a token.
        let b = Box::new(0u64);
        assert_eq!(Token::from_ptr(&*b as *const u64 as *mut _), None);
    }

    #[test]
    fn a_removed_object_is_stale_and_its_slot_reused_with_a_new_generation() {
        let t: Table<String> = Table::new();
        let a = t.insert(Kind::SendComm, "a".into()).ok().unwrap();
        assert_eq!(&*t.get(a).unwrap(), "a");
        assert_eq!(t.remove(a).unwrap(), "a");
        assert_eq!(t.get(a).err(), Some(Stale::Closed));
        assert_eq!(t.remove(a).err(), Some(Stale::Closed));
        let b = t.insert(Kind::SendComm, "b".into()).ok().unwrap();
        assert_ne!(a, b, "the slot is reused with another generation");
        assert_eq!(t.get(a).err(), Some(Stale::Closed));
        assert_eq!(&*t.get(b).unwrap(), "b");
        let never = Token { kind: Kind::SendComm, index: 5000, gen: 1, req: 0 };
        assert_eq!(t.get(never).err(), Some(Stale::Foreign));
    }

    #[test]
    fn try_get_does_not_wait() {
        let t: Table<u32> = Table::new();
        let a = t.insert(Kind::Mr, 7).ok().unwrap();
        let g = t.get(a).unwrap();
        assert!(t.try_get(a).is_none());
        drop(g);
        assert_eq!(*t.try_get(a).unwrap(), 7);
    }

    #[test]
    fn a_token_of_a_slot_never_filled_or_emptied_names_nothing() {
        let t: Table<u32> = Table::new();
        let a = t.insert(Kind::Mr, 1).ok().unwrap();
        // The next slot of the same chunk exists, empty, at the first generation.
        let forged = Token { index: a.index + 1, ..a };
        assert_eq!(t.get(forged).err(), Some(Stale::Closed));
        assert!(t.try_get(forged).is_none() && !t.live(forged));
        assert_eq!(t.remove(a).unwrap(), 1);
        // The emptied slot's next generation, before any object has it.
        let next = Token { gen: a.gen + 1, ..a };
        assert_eq!(t.get(next).err(), Some(Stale::Closed));
        assert!(t.try_get(next).is_none());
        let b = t.insert(Kind::Mr, 2).ok().unwrap();
        assert_eq!(b, next);
        assert_eq!(*t.get(b).unwrap(), 2);
    }

    #[test]
    fn a_panic_holding_an_object_poisons_it_and_close_still_takes_it() {
        let t: Table<u32> = Table::new();
        let a = t.insert(Kind::SendComm, 3).ok().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = t.get(a).unwrap();
            panic!("inside a call");
        }));
        assert!(r.is_err());
        assert_eq!(t.get(a).err(), Some(Stale::Poisoned));
        assert!(t.try_get(a).is_none());
        assert_eq!(t.remove(a).unwrap(), 3);
        let b = t.insert(Kind::SendComm, 4).ok().unwrap();
        assert_eq!(*t.get(b).unwrap(), 4, "the slot is usable again, unpoisoned");
    }

    #[test]
    fn a_guard_is_shared_between_threads_where_its_object_may_be() {
        // The counterpart of Guard's compile_fail doctest (a Cell's guard is not Sync).
        fn shared<T: Sync>() {}
        shared::<Guard<'static, u8>>();
    }

    #[test]
    fn calls_from_two_threads_on_one_object_take_turns() {
        let t: &'static Table<u64> = Box::leak(Box::new(Table::new()));
        let a = t.insert(Kind::RecvComm, 0).ok().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = t.get(a).unwrap();
                        // A read and a write apart: lost updates if two calls held it at once.
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(*t.get(a).unwrap(), 80_000);
        assert_eq!(t.remove(a).unwrap(), 80_000);
        assert_eq!(t.get(a).err(), Some(Stale::Closed));
    }
}
