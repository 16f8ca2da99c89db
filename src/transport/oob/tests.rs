//! The handshake over loopback: a connector that hands its link over before the listener's
//! acknowledgement (as the verbs setup uses it) still learns of a rejection, and what it writes
//! behind its hello reaches the accepted link intact.

use super::*;
use crate::error::Kind;
use std::os::fd::AsRawFd;

fn lo() -> Iface {
    ifaces::select(Some("lo"), Some(libc::AF_INET)).remove(0)
}

/// Polls `f` until it gives something, for at most 5 s.
fn until<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "nothing within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn write_all(fd: &OwnedFd, b: &[u8]) {
    let mut at = 0;
    until(|| {
        if let Io::Done(n) = sock::send_small(fd, &b[at..]).unwrap() {
            at += n;
        }
        (at == b.len()).then_some(())
    })
}

#[test]
fn a_link_before_the_ack_carries_what_follows_the_hello_and_then_reads_the_ack() {
    let t = Duration::from_secs(5);
    let (mut l, h) = Listener::new(&lo(), 1, t).unwrap();
    let mut c = Connector::new(&h, 1, 64 << 10, t).unwrap().ack_later();
    let mut link = until(|| c.poll().unwrap());
    let mut ack = link.ack.take().expect("the ack is left to read");
    let meta: Vec<u8> = (0..=255u8).collect();
    write_all(&link.fds[0], &meta);
    let got = until(|| l.accept_busy(false).unwrap());
    assert!(got.ack.is_none(), "the listener's link has no ack to wait for");
    let mut inb = vec![0u8; meta.len()];
    let mut at = 0;
    until(|| {
        // SAFETY: `at < inb.len()` while this runs, so the pointer and the bytes after it are in `inb`.
        if let Io::Done(n) = unsafe { sock::recv_into(got.fds[0].as_raw_fd(), inb.as_mut_ptr().add(at), inb.len() - at) }.unwrap() {
            at += n;
        }
        (at == inb.len()).then_some(())
    });
    assert_eq!(inb, meta, "the bytes behind the hello are the accepted link's first");
    assert!(until(|| ack.read(&link.fds[0], link.peer).unwrap().then_some(true)));
}

#[test]
fn a_rejected_handle_is_reported_from_the_ack_even_after_writing_behind_the_hello() {
    let t = Duration::from_secs(5);
    let (mut l, mut h) = Listener::new(&lo(), 1, t).unwrap();
    h.magic ^= 0x5a;
    let mut c = Connector::new(&h, 1, 64 << 10, t).unwrap().ack_later();
    let mut link = until(|| c.poll().unwrap());
    let mut ack = link.ack.take().unwrap();
    // The listener reads the hello, answers with the rejection and closes the stream.
    for _ in 0..50 {
        assert!(l.accept_busy(false).unwrap().is_none());
        std::thread::sleep(Duration::from_millis(2));
    }
    // What the connector writes now lands on a closed socket: the peer resets the stream.
    let _ = sock::send_small(&link.fds[0], &[0u8; 64]);
    std::thread::sleep(Duration::from_millis(50));
    let e = until(|| match ack.read(&link.fds[0], link.peer) {
        Ok(false) => None,
        Ok(true) => panic!("a wrong magic was accepted"),
        Err(e) => Some(e),
    });
    assert_eq!(e.kind, Kind::InvalidUsage, "{}", e.msg);
    assert!(e.msg.contains("rejected our handle"), "{}", e.msg);
}

#[test]
fn a_busy_listener_still_takes_a_new_connection_within_a_few_calls() {
    let t = Duration::from_secs(5);
    let (mut l, h) = Listener::new(&lo(), 1, t).unwrap();
    let mut c = Connector::new(&h, 1, 64 << 10, t).unwrap();
    let mut calls = 0;
    let link = until(|| {
        calls += 1;
        let _ = c.poll().unwrap();
        l.accept_busy(true).unwrap()
    });
    assert!(link.ack.is_none());
    assert!(until(|| c.poll().unwrap()).ack.is_none(), "a connector without ack_later waits for the ack");
    assert!(calls >= BUSY_ACCEPT_EVERY, "a busy listener asks the kernel only every few calls ({calls})");
}
