//! The `log` crate bridged to NCCL's logger. Inside NCCL every record goes to the `ncclDebugLogger_t`
//! handed to `init` (formatted in Rust, passed as `"%s"`); outside NCCL (the CLI, tests) the same
//! lines go to stderr. The level comes from `NCCL_DEBUG` (VERSION/WARN/INFO/TRACE; unset means WARN
//! outside NCCL, and NCCL applies its own filter on top inside it).
//!
//! Records whose target is [`INIT`] carry NCCL's `INIT|NET` subsystem flags, so they show with
//! NCCL's default `NCCL_DEBUG_SUBSYS`; everything else is `NET`.

use super::types::*;
use crate::log::{hostname, INIT};
use log::{Level, LevelFilter, Log, Metadata, Record};
use std::ffi::{c_char, CString};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static NCCL_LOGGER: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

struct Bridge;
static BRIDGE: Bridge = Bridge;

/// Install the bridge (once per process) and, when called from NCCL's `init`, remember its logger.
pub fn install(logger: ncclDebugLogger_t) {
    if let Some(f) = logger {
        NCCL_LOGGER.store(f as usize, Ordering::Release);
    }
    INSTALL.call_once(|| {
        if log::set_logger(&BRIDGE).is_ok() {
            // WARN first, so that an invalid NCCL_DEBUG's own WARN is seen.
            log::set_max_level(LevelFilter::Warn);
            log::set_max_level(crate::config::debug_level(&crate::config::env));
        }
    });
}

/// Forget NCCL's logger (used by tests that call the plugin outside NCCL after an init with one).
pub fn clear_nccl_logger() {
    NCCL_LOGGER.store(0, Ordering::Release);
}

impl Log for Bridge {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = format!("{}", r.args());
        let f = NCCL_LOGGER.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: `f` is the non-NULL ncclDebugLogger_t NCCL passed to init (stored as usize
            // by `install`), whose C type is exactly this variadic function pointer.
            let f: unsafe extern "C" fn(i32, u64, *const c_char, i32, *const c_char, ...) =
                unsafe { std::mem::transmute(f) };
            let level = match r.level() {
                Level::Error | Level::Warn => NCCL_LOG_WARN,
                Level::Info | Level::Debug => NCCL_LOG_INFO,
                Level::Trace => NCCL_LOG_TRACE,
            };
            let flags = if r.target() == INIT { NCCL_INIT | NCCL_NET } else { NCCL_NET };
            let cmsg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
            let file = CString::new(r.file().unwrap_or("rivet")).unwrap_or_default();
            // SAFETY: NCCL's logger with its format "%s" and one NUL-terminated string argument
            // (the message, with NULs replaced), both alive for the call.
            unsafe {
                f(level, flags, file.as_ptr(), r.line().unwrap_or(0) as i32, c"%s".as_ptr(), cmsg.as_ptr())
            };
        } else {
            let host = hostname();
            let pid = std::process::id();
            // The system call, not glibc's gettid() wrapper: that appeared in glibc 2.30, and the
            // release build must load on glibc 2.17 (RHEL 8 has 2.28).
            // SAFETY: SYS_gettid takes no arguments and cannot fail.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            let lvl = match r.level() {
                Level::Error | Level::Warn => "WARN",
                Level::Info | Level::Debug => "INFO",
                Level::Trace => "TRACE",
            };
            // One write per line: processes sharing stderr (ranks) must not interleave within one.
            let line = format!("{host}:{pid}:{tid} [rivet] NCCL {lvl} {msg}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

