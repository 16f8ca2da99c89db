//! The rules of `QpStates`, one by one.
use super::*;

fn states(n: usize) -> QpStates {
    QpStates::new(n, Retry { all: false, count: 3, sleep_ms: 10 }, Recovery { on: true, delay_ms: 100, attempts: 2 })
}

#[test]
fn failing_the_last_live_queue_pair_leaves_none_to_fail_over_to() {
    let mut s = states(3);
    assert_eq!(s.fail(0b001), Failed::Over { new: 0b001 });
    assert_eq!(s.fail(0b011), Failed::Over { new: 0b010 }, "only what is new");
    assert_eq!(s.fail(0b010), Failed::Known);
    assert!(s.due());
    s.failed_over(0b011, 7);
    assert!(!s.due());
    assert_eq!((s.failed(), s.dead(), s.down()), (0, 0b011, 0b011));
    assert_eq!(s.fail(0b1100), Failed::NoneLeft { new: 0b100 }, "bits past the queue pairs are not queue pairs");
}

#[test]
fn the_peer_naming_a_queue_pair_makes_a_failover_due_until_it_is_failed_over_here() {
    let mut s = states(2);
    s.peer_named(0b10);
    assert!(s.due());
    s.failed_over(0b10, 1);
    assert!(!s.due());
    s.taken_back(0b10);
    assert_eq!((s.dead(), s.peer_dead()), (0, 0), "taken back: the peer's word is needed again");
}

#[test]
fn a_drain_is_over_at_its_markers_or_after_quiet_and_fails_after_drain_wait() {
    let mut s = states(2);
    let mut d = Drain::new(0b11, 1000);
    s.marker(0);
    assert_eq!(s.drain_state(&mut d, 1001), Drained::No);
    s.marker(1);
    assert_eq!(s.drain_state(&mut d, 1002), Drained::Yes);

    // No marker from queue pair 1: quiet stands in for it after MARKER_WAIT_MS, but each of
    // its flushed completions starts the quiet again.
    let mut s = states(2);
    let mut d = Drain::new(0b10, 0);
    s.marker(0);
    assert_eq!(s.drain_state(&mut d, MARKER_WAIT_MS), Drained::No);
    assert!(!s.flushed(1));
    assert_eq!(s.drain_state(&mut d, MARKER_WAIT_MS + 1), Drained::No, "a completion just came");
    assert_eq!(s.drain_state(&mut d, MARKER_WAIT_MS + 1 + QUIET_MS), Drained::No);
    assert_eq!(s.drain_state(&mut d, MARKER_WAIT_MS + 2 + QUIET_MS), Drained::Quiet { unmarked: 0b10 });

    // Completions that never stop: the drain times out.
    let mut s = states(1);
    let mut d = Drain::new(0b1, 0);
    let mut now = 0;
    let end = loop {
        s.flushed(0);
        now += 50;
        match s.drain_state(&mut d, now) {
            Drained::No => continue,
            other => break other,
        }
    };
    assert_eq!(end, Drained::TimedOut { unmarked: 0b1 });
    assert_eq!(now, DRAIN_WAIT_MS + 50);
}

#[test]
fn a_refused_move_to_err_is_tried_later_as_mqp_retry_says_and_holds_its_drain() {
    let mut s = states(2);
    assert_eq!(s.refused(1, false, 0), Refused::GiveUp { tries: 0 }, "only ETIMEDOUT is retried");
    assert_eq!(s.refused(1, true, 0), Refused::Later { first: true });
    assert_eq!(s.moves_due(9), 0);
    assert_eq!(s.moves_due(10), 0b10);
    let mut d = Drain::new(0b10, 0);
    assert_eq!(s.drain_state(&mut d, DRAIN_WAIT_MS * 2), Drained::No, "a move not made holds the drain's clock");
    assert_eq!(s.refused(1, true, 10), Refused::Later { first: false });
    assert_eq!(s.moves_due(29), 0, "the second retry 2 x 10 ms later");
    assert_eq!(s.refused(1, true, 30), Refused::Later { first: false });
    assert_eq!(s.refused(1, true, 60), Refused::GiveUp { tries: 3 });
    assert_eq!(s.moves_due(u64::MAX), 0);

    let mut s = states(1);
    s.refused(0, true, 0);
    s.moved(0);
    assert_eq!(s.moves_due(u64::MAX), 0);
    assert_eq!(s.refused(0, true, 0), Refused::Later { first: true }, "a move made starts its count again");
}

#[test]
fn recovery_asks_back_after_its_delay_while_attempts_last_and_the_port_is_up() {
    let mut s = states(3);
    assert_eq!(s.recoverable(1_000, |_| true), 0, "nothing failed over");
    s.fail(0b011);
    s.failed_over(0b011, 1_000);
    assert_eq!(s.recoverable(1_099, |_| true), 0, "START_DELAY not over");
    assert_eq!(s.recoverable(1_100, |_| true), 0b011);
    assert_eq!(s.recoverable(1_100, |q| q == 1), 0b010, "a port still down is not asked back");
    s.asking(1, 1_100);
    assert_eq!(s.recoverable(1_150, |_| true), 0b001, "the next attempt START_DELAY after the last");
    s.asking(1, 1_200);
    assert_eq!(s.recoverable(10_000, |_| true), 0b001, "ATTEMPTS_MAX reached");
    s.recovered(1);
    assert_eq!(s.recoverable(10_000, |_| true), 0b011);
    s.taken_back(0b001);
    assert_eq!(s.recoverable(10_000, |_| true), 0b010);
    let off = QpStates::new(3, Retry::default(), Recovery { on: false, delay_ms: 0, attempts: 9 });
    assert_eq!(off.recoverable(0, |_| true), 0, "recovery off");
}

#[test]
fn the_receiver_moves_the_map_off_what_drained_and_home_once_the_sender_answers() {
    let mut s = states(3);
    s.fail(0b010);
    assert!(s.recv_drained(0b010, 10));
    assert_eq!(&s.map()[..3], &[0, 2, 2]);
    assert_eq!(s.carried(2), 2);
    s.taken_back(0b010);
    s.recv_asked(0b010);
    assert_eq!((s.dead(), s.asked(), s.recv_gone()), (0, 0b010, 0b010), "asked back: live, but not to send on yet");
    // The sender answers for one asked and one not.
    assert_eq!(s.recv_answered(0b010, 0b001, 20), (0b010, 0));
    s.recv_home();
    assert_eq!(&s.map()[..3], &[0, 1, 2], "logical 1 home again");
    // Asked back and refused: failed over again, the sender's side in ERR.
    s.fail(0b100);
    assert!(s.recv_drained(0b100, 30));
    s.taken_back(0b100);
    s.recv_asked(0b100);
    assert_eq!(s.recv_answered(0, 0b100, 40), (0, 0b100));
    assert_eq!((s.dead(), s.peer_dead() & 0b100), (0b100, 0b100));
    s.recv_home();
    assert_eq!(&s.map()[..3], &[0, 1, 0]);
    s.fail(0b011);
    assert!(!s.recv_drained(0b011, 50), "none left");
}

#[test]
fn logical_queue_pair_zero_stays_where_it_went_when_its_own_comes_back() {
    let mut s = states(2);
    s.fail(0b01);
    s.failed_over(0b01, 1);
    assert_eq!(s.send_account(0b01), Some(0b01));
    assert_eq!(s.send_account(0b01), Some(0), "an account applied once");
    assert_eq!(&s.map()[..2], &[1, 1]);
    assert_eq!(s.send_may_take_back(0b11), 0b01, "only what failed over and was accounted for");
    s.send_took_back(0b01);
    assert_eq!(s.send_home(0), (false, false), "logical 0 stays: its eager messages arrive in order on one queue pair");
    assert_eq!(&s.map()[..2], &[1, 1]);
    assert_eq!(s.send_account(0b11), None, "none left");
}

#[test]
fn the_sender_moves_a_logical_queue_pair_home_only_once_none_of_its_parts_is_half_posted() {
    let mut s = states(3);
    s.fail(0b110);
    s.failed_over(0b110, 1);
    assert_eq!(s.send_account(0b110), Some(0b110));
    assert_eq!(&s.map()[..3], &[0, 0, 0]);
    s.send_took_back(0b110);
    assert_eq!(s.send_home(0b100), (true, true), "logical 1 moves, logical 2 waits for its part");
    assert_eq!(&s.map()[..3], &[0, 1, 0]);
    assert_eq!(s.send_home(0), (true, false));
    assert_eq!(&s.map()[..3], &[0, 1, 2]);
}

#[test]
fn a_failed_completion_fails_over_waits_for_its_port_or_kills_the_comm() {
    use Fault::*;
    let yes = || true;
    let no = || false;
    let mut s = states(2);
    assert_eq!(s.on_fault(RetryExceeded, Source::Data(0), true, false, no, no), OnFault::FailOver);
    assert_eq!(s.on_fault(Flushed, Source::Data(1), true, false, no, no), OnFault::FailOver);
    assert_eq!(s.on_fault(Flushed, Source::Flush, true, false, no, no), OnFault::FailOver, "a flush queue pair's member fails over");
    assert_eq!(s.on_fault(Flushed, Source::Unknown, true, false, no, yes), OnFault::Die, "not the comm's: nothing to fail over");
    // LOC_QP_OP_ERR: the port's word decides.
    assert_eq!(s.on_fault(LocalQpOp, Source::Data(0), true, false, no, no), OnFault::AwaitPort);
    assert_eq!(s.on_fault(LocalQpOp, Source::Data(0), true, false, yes, no), OnFault::FailOver, "down, or flapped");
    assert_eq!(s.on_fault(LocalQpOp, Source::Data(0), true, true, yes, no), OnFault::Ignore, "awaiting its verdict already");
    assert_eq!(s.on_fault(LocalQpOp, Source::Flush, true, false, no, no), OnFault::AwaitPort, "a flush queue pair's too: its read, on a port whose state says DOWN only a moment later");
    assert_eq!(s.on_fault(LocalQpOp, Source::Flush, true, false, yes, no), OnFault::FailOver);
    assert_eq!(s.on_fault(LocalQpOp, Source::Unknown, true, false, no, yes), OnFault::Die, "not the comm's");
    assert_eq!(s.on_fault(LocalQpOp, Source::Data(0), false, false, yes, yes), OnFault::Die, "no failover: a bug of one side");
    // Without failover, a dead link's error waits for its cause.
    assert_eq!(s.on_fault(RetryExceeded, Source::Data(0), false, false, no, no), OnFault::AwaitCause);
    assert_eq!(s.on_fault(RnrRetryExceeded, Source::Data(0), true, false, no, no), OnFault::AwaitCause, "RNR is not a link's failure");
    assert_eq!(s.on_fault(RetryExceeded, Source::Data(0), false, false, no, yes), OnFault::Die);
    assert_eq!(s.on_fault(Other, Source::Data(0), true, false, yes, yes), OnFault::Die);
    // A queue pair failed over flushes its queue: nothing more.
    s.fail(0b01);
    s.failed_over(0b01, 1);
    assert_eq!(s.on_fault(Other, Source::Data(0), true, false, yes, yes), OnFault::Ignore);
    assert_eq!(s.flushed_counts()[0], 10, "every failed completion of queue pair 0 counted");
}

#[test]
fn taking_back_forgets_the_drain_and_flushed_completions() {
    let mut s = states(2);
    s.fail(0b01);
    s.flushed(0);
    s.marker(0);
    s.failed_over(0b01, 5);
    assert!(s.flushed(0), "a completion of a queue pair failed over is its queue flushed");
    s.taken_back(0b01);
    assert_eq!(s.flushed_counts(), &[0, 0]);
    let mut d = Drain::new(0b01, 0);
    assert_eq!(s.drain_state(&mut d, 1), Drained::No, "a new failure's drain waits for a new marker");
}
