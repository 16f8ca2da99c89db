//! Log targets and facts shared by the library's log lines. Records go through the `log` crate;
//! the ABI layer's bridge (`abi::logger`) hands them to NCCL's logger, or to stderr outside NCCL.

/// Log target for the one-line-per-decision messages users read with `NCCL_DEBUG=INFO` (shown
/// with NCCL's `INIT|NET` subsystem flags).
pub const INIT: &str = "rivet::init";

use std::ffi::c_char;

/// This host's name, for log lines written outside NCCL.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our local buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The steps of one connection's setup and when each ended, for its INFO line ("connected to
/// ... in 35.2 ms (TCP and hello 3.6, ack 3.8, ...)"): where a slow job start goes. Its steps
/// read the clock only when that line will be written (`NCCL_DEBUG=INFO`): in a VM or a container
/// without a vDSO clock each read is a system call, and a job connects hundreds of comms.
#[derive(Clone, Copy, Debug, Default)]
pub struct Steps {
    t0: Option<std::time::Instant>,
    marks: [(&'static str, u32); STEPS],
    n: u8,
}

/// Most steps a connection's setup records (later ones are not).
const STEPS: usize = 10;

impl Steps {
    /// Timing from `t0` (a time the caller takes anyway: no clock is read here), if the
    /// connection's INFO line will be written.
    pub fn since(t0: std::time::Instant) -> Steps {
        let on = log::log_enabled!(target: INIT, log::Level::Info);
        Steps { t0: on.then_some(t0), ..Steps::default() }
    }

    /// Step `what` ended now.
    pub fn mark(&mut self, what: &'static str) {
        if let Some(t0) = self.t0 {
            if (self.n as usize) < STEPS {
                self.marks[self.n as usize] = (what, t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                self.n += 1;
            }
        }
    }

    /// " in 35.2 ms (TCP and hello 3.6, ...)": the whole and each step's own share, in ms; empty
    /// when not timed.
    pub fn describe(&self) -> String {
        let Some(t0) = self.t0 else { return String::new() };
        let ms = |us: u32| us as f64 / 1e3;
        let mut last = 0;
        let parts: Vec<String> = self.marks[..self.n as usize]
            .iter()
            .map(|&(what, at)| {
                let d = at.saturating_sub(last);
                last = at;
                format!("{what} {:.1}", ms(d))
            })
            .collect();
        format!(" in {:.1} ms ({})", t0.elapsed().as_secs_f64() * 1e3, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::Steps;

    #[test]
    fn steps_untimed_say_nothing_and_timed_ones_add_up() {
        let mut s = Steps::default();
        s.mark("a");
        assert_eq!(s.describe(), "");
        let mut s = Steps { t0: Some(std::time::Instant::now()), ..Steps::default() };
        s.marks[0] = ("TCP", 1500);
        s.marks[1] = ("hello", 4000);
        s.n = 2;
        let d = s.describe();
        assert!(d.starts_with(" in "), "{d}");
        assert!(d.ends_with(" ms (TCP 1.5, hello 2.5)"), "{d}");
        for _ in 0..20 {
            s.mark("x");
        }
        assert_eq!(s.n as usize, super::STEPS);
    }
}
