//! A queue pair's state changes (`ibv_modify_qp`): INIT, RTR and RTS with their attributes, and
//! NCCL_IB_MQP_RETRY_*'s retries of a change that times out: with their sleeps at setup; a
//! failover's move to ERR is tried once per call (`to_err_once`) and its retries are deadlines
//! later calls keep (`Common::move_to_err`); recovery's changes are not retried inside a call.

use super::*;

/// NCCL_IB_MQP_RETRY_*: how a failing `ibv_modify_qp` is tried again (net_ib's meaning). Large
/// RoCE jobs see ETIMEDOUT from it while the NIC's firmware is busy setting up thousands of
/// queue pairs; trying again, later each time, gets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MqpRetry {
    /// Retry whatever the error; otherwise only ETIMEDOUT.
    pub all: bool,
    /// Retries after the first try.
    pub count: u32,
    /// Retry n waits n times this.
    pub sleep_ms: u64,
}

impl From<MqpRetry> for crate::proto::qps::Retry {
    fn from(r: MqpRetry) -> Self {
        crate::proto::qps::Retry { all: r.all, count: r.count, sleep_ms: r.sleep_ms }
    }
}

impl MqpRetry {
    /// Run `call` (returning 0 or an errno) until it succeeds, fails with an error not to retry,
    /// or has been retried `count` times; retry n first passes n × `sleep_ms` to `sleep`.
    /// Returns the last result and the retries made.
    pub fn run(&self, mut call: impl FnMut() -> c_int, mut sleep: impl FnMut(std::time::Duration)) -> (c_int, u32) {
        let mut retries = 0;
        loop {
            let rc = call();
            if rc == 0 || retries >= self.count || !(self.all || rc == libc::ETIMEDOUT) {
                return (rc, retries);
            }
            retries += 1;
            sleep(std::time::Duration::from_millis(self.sleep_ms.saturating_mul(retries as u64)));
        }
    }
}

/// NCCL_IB_MQP_RETRY_*'s retries, with their sleeps: at setup, as net_ib (and for a failover's
/// move to ERR, see `QpRts::to_err`).
pub(super) fn setup_retry() -> Option<MqpRetry> {
    Some(crate::config::get().ib_mqp_retry)
}

/// Once, without a retry: a change recovery makes from inside `test`, which must not sleep on
/// NCCL's proxy thread. A take-back that fails is tried again at recovery's next attempt
/// (NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY later), which stands for the retry; the error
/// says so.
pub(super) const IN_CALL: Option<MqpRetry> = None;
/// What `IN_CALL` runs with.
pub(super) const NO_RETRY: MqpRetry = MqpRetry { all: false, count: 0, sleep_ms: 0 };

/// Move `qp` to `what` with `attr` (the fields `mask` names), with NCCL_IB_MQP_RETRY_*'s retries
/// (`Some`) or once, inside a data-path call (`IN_CALL`).
pub(super) fn modify(qp: &Qp, attr: &mut ibv_qp_attr, mask: u32, what: &str, port: &IbPort, retry_with: Option<MqpRetry>) -> Result<()> {
    let retry = retry_with.unwrap_or(NO_RETRY);
    let (rc, retries) = retry.run(
        // SAFETY: `modify_qp` is ibv_modify_qp, resolved with the C signature declared in Verbs;
        // qp.raw is live (Qp destroys it only in Drop, and it is borrowed here), and `attr` is an
        // exclusive reference to an initialised ibv_qp_attr. ibv_modify_qp(3) reads the fields
        // selected by `mask`, all of which the callers set, and on failure leaves the queue pair
        // as it was, so the same call may be made again.
        || unsafe { (v().modify_qp)(qp.raw, attr, mask as c_int) },
        |pause| {
            log::info!(
                "NET/rivet: {}:{}: moving QP {} to {what} timed out; retrying in {} ms (NCCL_IB_MQP_RETRY_CNT={}, NCCL_IB_MQP_RETRY_SLEEP_MSEC={})",
                port.dev.name,
                port.port,
                qp.qpn(),
                pause.as_millis(),
                retry.count,
                retry.sleep_ms
            );
            std::thread::sleep(pause)
        },
    );
    if rc != 0 {
        let after = if retries > 0 {
            format!(" (after {retries} retries: NCCL_IB_MQP_RETRY_CNT)")
        } else if retry_with.is_none() && rc == libc::ETIMEDOUT {
            " (not retried inside a data-path call: recovery's next attempt tries again)".to_string()
        } else {
            String::new()
        };
        return Err(Error::system(format!(
            "{}:{}: moving QP {} to {what} failed: {}{after}",
            port.dev.name,
            port.port,
            qp.qpn(),
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    if retries > 0 {
        log::info!("NET/rivet: {}:{}: QP {} reached {what} after {retries} retries", port.dev.name, port.port, qp.qpn());
    }
    Ok(())
}

/// Move `qp` to ERR once, without a retry or a sleep: refused, the errno (ETIMEDOUT: the device
/// is busy) and the error.
pub(super) fn to_err_once(qp: &Qp, port: &IbPort) -> std::result::Result<(), (c_int, Error)> {
    // SAFETY: ibv_qp_attr is plain C data (see `to_init`); only the state is read for this mask.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_ERR;
    // SAFETY: as in `modify`: ibv_modify_qp with the C signature, a live queue pair, an exclusive
    // initialised attr of which it reads only the state; a refusal leaves the queue pair as it
    // was.
    let rc = unsafe { (v().modify_qp)(qp.raw, &mut a, IBV_QP_STATE as c_int) };
    if rc == 0 {
        return Ok(());
    }
    let e = Error::system(format!("{}:{}: moving QP {} to ERR failed: {}", port.dev.name, port.port, qp.qpn(), std::io::Error::from_raw_os_error(rc)));
    Err((rc, e))
}

/// RESET → INIT on `port` with `access`.
pub(super) fn to_init(qp: &Qp, port: &IbPort, access: u32, pkey_index: u16, retry: Option<MqpRetry>) -> Result<()> {
    // SAFETY: ibv_qp_attr is repr(C) of integers, c_uint enum aliases and nested plain structs
    // (ibv_qp_cap, ibv_ah_attr with its ibv_gid union), with no pointers or Rust enums, so
    // all-zero is a valid value; ibv_modify_qp reads only the fields named in the mask, which
    // are set below.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = pkey_index;
    a.port_num = port.port;
    a.qp_access_flags = access;
    modify(qp, &mut a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT", port, retry)
}

/// Warned once: a peer across subnets without a FLID.
static NO_FLID_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// INIT → RTR towards `remote`.
pub(super) fn to_rtr(qp: &Qp, port: &IbPort, remote: &RemoteQp, p: &PathParams, retry: Option<MqpRetry>) -> Result<()> {
    // SAFETY: ibv_qp_attr is repr(C) of integers, c_uint enum aliases and nested plain structs
    // (ibv_qp_cap, ibv_ah_attr with its ibv_gid union), with no pointers or Rust enums, so
    // all-zero is a valid value; ibv_modify_qp reads only the fields named in the mask, which
    // are set below.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = p.mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = port.port;
    a.ah_attr.sl = p.sl;
    let av = super::super::select::address_vector(port.is_roce(), &port.gid, port.grh_required, remote.lid, &remote.gid, p.tc);
    if av.no_flid && !NO_FLID_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "NET/rivet: {}:{}: the peer {} is in another InfiniBand subnet but its GID holds no FLID: routing by its LID {}, which the fabric may not route across subnets (check the subnet manager's FLID set-up, or NCCL_IB_ROUTABLE_FLID_GID_INDEX on the peer)",
            port.dev.name,
            port.port,
            super::super::select::describe_gid(&remote.gid),
            remote.lid
        );
    }
    a.ah_attr.dlid = av.dlid;
    if av.global || remote.global {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
        a.ah_attr.grh.sgid_index = port.gid_index as u8;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = av.traffic_class;
    }
    let mask = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    modify(qp, &mut a, mask, "RTR", port, retry)
}

/// RTR → RTS with the retry settings.
pub(super) fn to_rts(qp: &Qp, port: &IbPort, p: &PathParams, retry: Option<MqpRetry>) -> Result<()> {
    // SAFETY: ibv_qp_attr is repr(C) of integers, c_uint enum aliases and nested plain structs
    // (ibv_qp_cap, ibv_ah_attr with its ibv_gid union), with no pointers or Rust enums, so
    // all-zero is a valid value; ibv_modify_qp reads only the fields named in the mask, which
    // are set below.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_RTS;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    let mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    modify(qp, &mut a, mask, "RTS", port, retry)
}

#[cfg(test)]
mod tests {
    use super::super::MqpRetry;
    use std::time::Duration;

    /// Results to return in turn, the sleeps asked for, and what `run` gave back.
    fn drive(r: MqpRetry, results: &[i32]) -> (i32, u32, Vec<u64>, usize) {
        let mut calls = 0;
        let mut sleeps = Vec::new();
        let (rc, retries) = r.run(
            || {
                calls += 1;
                results[(calls - 1).min(results.len() - 1)]
            },
            |d: Duration| sleeps.push(d.as_millis() as u64),
        );
        (rc, retries, sleeps, calls)
    }

    #[test]
    fn modify_qp_is_retried_on_etimedout_with_growing_sleeps() {
        let r = MqpRetry { all: false, count: 34, sleep_ms: 100 };
        let t = libc::ETIMEDOUT;
        assert_eq!(drive(r, &[0]), (0, 0, vec![], 1));
        assert_eq!(drive(r, &[t, t, t, 0]), (0, 3, vec![100, 200, 300], 4));
        // Other errors fail at once unless NCCL_IB_MQP_RETRY_ALL.
        assert_eq!(drive(r, &[libc::EINVAL]), (libc::EINVAL, 0, vec![], 1));
        assert_eq!(drive(r, &[t, libc::EINVAL, 0]), (libc::EINVAL, 1, vec![100], 2));
        let all = MqpRetry { all: true, ..r };
        assert_eq!(drive(all, &[libc::EINVAL, libc::EBUSY, 0]), (0, 2, vec![100, 200], 3));
        // At most `count` retries: count + 1 tries, sleeping 1..=count times the base.
        let (rc, retries, sleeps, calls) = drive(r, &[t]);
        assert_eq!((rc, retries, calls), (t, 34, 35));
        assert_eq!(sleeps.iter().sum::<u64>(), 100 * 34 * 35 / 2);
        assert_eq!(drive(MqpRetry { count: 0, ..r }, &[t]), (t, 0, vec![], 1));
    }

    #[test]
    fn a_take_back_inside_a_data_path_call_never_sleeps() {
        // Recovery's transitions (from `test`) try once; the next recovery attempt is the retry.
        let t = libc::ETIMEDOUT;
        assert_eq!(drive(super::NO_RETRY, &[t, 0]), (t, 0, vec![], 1));
        assert_eq!(drive(super::NO_RETRY, &[0]), (0, 0, vec![], 1));
    }
}
