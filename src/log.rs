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
