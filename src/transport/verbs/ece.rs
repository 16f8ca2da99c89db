//! Enhanced connection establishment (`NCCL_IB_ECE_ENABLE`), negotiated per queue pair as net_ib
//! does: the sender queries its queue pairs' ECE once they are in INIT and offers it in its
//! metadata; the receiver sets each offered ECE on its own queue pair before RTR, queries what
//! its device made of it after RTS (the reduced options) and sends that back; the sender sets the
//! reply on its queue pair before RTR. Where either side's device or libibverbs lacks ECE
//! (EOPNOTSUPP, as Soft-RoCE answers), the queue pair goes on without it and this is logged once
//! per device; any other failure of the calls fails the connection, as in net_ib.

use crate::proto::verbs::Ece;
use std::sync::Mutex;

/// One side's ECE calls on its queue pairs: `Ok(None)` where ECE is unsupported (EOPNOTSUPP,
/// ENOTSUP, or a libibverbs without the call), `Err(errno)` on any other failure. `set` returns
/// what the device accepted (`ibv_set_ece`'s argument is in/out).
pub trait Ops {
    fn query(&mut self, q: usize) -> Result<Option<Ece>, i32>;
    fn set(&mut self, q: usize, e: Ece) -> Result<Option<Ece>, i32>;
}

/// A failed ECE call: the queue pair's index, the call and its errno.
#[derive(Debug, PartialEq, Eq)]
pub struct Failed {
    pub q: usize,
    pub call: &'static str,
    pub errno: i32,
}

fn on<T>(q: usize, call: &'static str, r: Result<T, i32>) -> Result<T, Failed> {
    r.map_err(|errno| Failed { q, call, errno })
}

/// The sender, its `nqps` queue pairs in INIT: the ECE it offers for each (none when `enabled`
/// is false or the device lacks ECE).
pub fn offer(ops: &mut dyn Ops, nqps: usize, enabled: bool) -> Result<Vec<Option<Ece>>, Failed> {
    if !enabled {
        return Ok(vec![None; nqps]);
    }
    (0..nqps).map(|q| on(q, "ibv_query_ece", ops.query(q))).collect()
}

/// The receiver, its queue pairs in INIT (before RTR): sets the sender's ECE on each queue pair
/// it was offered for. Whether each took it. (As in net_ib, the receiver follows the sender's
/// NCCL_IB_ECE_ENABLE: an offer is made only when it is on.)
pub fn accept(ops: &mut dyn Ops, offered: &[Option<Ece>]) -> Result<Vec<bool>, Failed> {
    offered
        .iter()
        .enumerate()
        .map(|(q, o)| match o {
            Some(e) => on(q, "ibv_set_ece", ops.set(q, *e)).map(|r| r.is_some()),
            None => Ok(false),
        })
        .collect()
}

/// The receiver, its queue pairs in RTS: the ECE it sends back for each that took the offer
/// (what its device reduced the options to).
pub fn reply(ops: &mut dyn Ops, took: &[bool]) -> Result<Vec<Option<Ece>>, Failed> {
    took.iter().enumerate().map(|(q, &t)| if t { on(q, "ibv_query_ece", ops.query(q)) } else { Ok(None) }).collect()
}

/// The sender, its queue pairs in INIT (before RTR): sets the receiver's reply on each queue pair
/// where both sides support ECE. What each queue pair runs with (for the log, and to set again
/// when a failed queue pair is taken back).
pub fn apply(ops: &mut dyn Ops, offered: &[Option<Ece>], replied: &[Option<Ece>]) -> Result<Vec<Option<Ece>>, Failed> {
    offered
        .iter()
        .enumerate()
        .map(|(q, o)| match (o, replied.get(q).copied().flatten()) {
            (Some(_), Some(r)) => on(q, "ibv_set_ece", ops.set(q, r)),
            _ => Ok(None),
        })
        .collect()
}

/// Devices whose lack of ECE was already logged.
static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Log once per device that it has no ECE.
pub fn note_unsupported(dev: &str, why: &str) {
    let mut n = NOTED.lock().unwrap_or_else(|p| p.into_inner());
    if !n.iter().any(|d| d == dev) {
        n.push(dev.to_string());
        log::info!("NET/rivet: {dev}: no enhanced connection establishment (ECE) ({why}); its queue pairs are connected without it (NCCL_IB_ECE_ENABLE)");
    }
}

/// "ECE 0x15b3:0x30000001" for a connection's log line, when any queue pair runs with one.
pub fn describe(set: &[Option<Ece>]) -> String {
    match set.iter().flatten().next() {
        Some(e) => format!(", ECE {:#x}:{:#x} on {} of {} QP(s)", e.vendor_id, e.options, set.iter().flatten().count(), set.len()),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's ECE: None when it has none; `fail` makes every call fail with that errno.
    /// `set` keeps the options both sides have (what a NIC's reduction does), and `query`
    /// returns what was set, or the device's own.
    struct Dev {
        own: Option<Ece>,
        set_on: Vec<Option<Ece>>,
        fail: Option<i32>,
        calls: Vec<(&'static str, usize)>,
    }

    impl Dev {
        fn new(own: Option<Ece>, nqps: usize) -> Dev {
            Dev { own, set_on: vec![None; nqps], fail: None, calls: Vec::new() }
        }
    }

    impl Ops for Dev {
        fn query(&mut self, q: usize) -> Result<Option<Ece>, i32> {
            self.calls.push(("query", q));
            if let Some(e) = self.fail {
                return Err(e);
            }
            Ok(self.own.map(|o| self.set_on[q].unwrap_or(o)))
        }
        fn set(&mut self, q: usize, e: Ece) -> Result<Option<Ece>, i32> {
            self.calls.push(("set", q));
            if let Some(e) = self.fail {
                return Err(e);
            }
            let Some(o) = self.own else { return Ok(None) };
            let r = Ece { options: o.options & e.options, ..e };
            self.set_on[q] = Some(r);
            Ok(Some(r))
        }
    }

    fn ece(options: u32) -> Option<Ece> {
        Some(Ece { vendor_id: 0x15b3, options, comp_mask: 0 })
    }

    /// The whole exchange between a sender device and a receiver device: what the sender offers,
    /// what comes back, and what each side's queue pairs run with.
    /// Each queue pair's ECE at one step of the exchange.
    type PerQp = Vec<Option<Ece>>;

    fn negotiate(s: &mut Dev, r: &mut Dev, nqps: usize, enabled: bool) -> (PerQp, PerQp, PerQp) {
        let offered = offer(s, nqps, enabled).unwrap();
        let took = accept(r, &offered).unwrap();
        let replied = reply(r, &took).unwrap();
        let set = apply(s, &offered, &replied).unwrap();
        (offered, replied, set)
    }

    #[test]
    fn both_sides_run_with_the_options_both_support() {
        let (mut s, mut r) = (Dev::new(ece(0b1111), 2), Dev::new(ece(0b0101), 2));
        let (offered, replied, set) = negotiate(&mut s, &mut r, 2, true);
        assert_eq!(offered, vec![ece(0b1111); 2]);
        assert_eq!(replied, vec![ece(0b0101); 2], "the receiver's device reduced the options");
        assert_eq!(set, vec![ece(0b0101); 2]);
        assert_eq!(s.set_on, r.set_on, "both ends of each queue pair set the same ECE");
        // The receiver sets before it queries; the sender queries once, and sets once per QP.
        assert_eq!(r.calls, vec![("set", 0), ("set", 1), ("query", 0), ("query", 1)]);
        assert_eq!(s.calls, vec![("query", 0), ("query", 1), ("set", 0), ("set", 1)]);
    }

    #[test]
    fn a_side_without_ece_leaves_both_without_it() {
        // The sender's device has none: nothing is offered, the receiver calls nothing.
        let (mut s, mut r) = (Dev::new(None, 2), Dev::new(ece(1), 2));
        let (offered, replied, set) = negotiate(&mut s, &mut r, 2, true);
        assert_eq!((offered, replied, set), (vec![None; 2], vec![None; 2], vec![None; 2]));
        assert!(r.calls.is_empty());
        // The receiver's has none: its set says so, it queries nothing, the sender sets nothing.
        let (mut s, mut r) = (Dev::new(ece(1), 2), Dev::new(None, 2));
        let (_, replied, set) = negotiate(&mut s, &mut r, 2, true);
        assert_eq!((replied, set), (vec![None; 2], vec![None; 2]));
        assert_eq!(r.calls, vec![("set", 0), ("set", 1)]);
        assert_eq!(s.calls, vec![("query", 0), ("query", 1)]);
        // NCCL_IB_ECE_ENABLE=0 on the sender: no call on either side.
        let (mut s, mut r) = (Dev::new(ece(1), 2), Dev::new(ece(1), 2));
        let (_, _, set) = negotiate(&mut s, &mut r, 2, false);
        assert_eq!(set, vec![None; 2]);
        assert!(s.calls.is_empty() && r.calls.is_empty());
    }

    #[test]
    fn other_failures_name_the_queue_pair_and_call() {
        let mut s = Dev::new(ece(1), 3);
        s.fail = Some(libc::EINVAL);
        assert_eq!(offer(&mut s, 3, true), Err(Failed { q: 0, call: "ibv_query_ece", errno: libc::EINVAL }));
        let mut r = Dev::new(ece(1), 2);
        r.fail = Some(libc::EIO);
        assert_eq!(accept(&mut r, &[None, ece(1)]), Err(Failed { q: 1, call: "ibv_set_ece", errno: libc::EIO }));
    }

    #[test]
    fn the_log_names_the_ece() {
        assert_eq!(describe(&[None, None]), "");
        assert_eq!(describe(&[ece(5), None]), ", ECE 0x15b3:0x5 on 1 of 2 QP(s)");
    }
}
