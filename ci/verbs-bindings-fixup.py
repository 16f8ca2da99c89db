#!/usr/bin/env python3
"""Make bindgen's x86_64 output of <infiniband/verbs.h> right on aarch64 too (ci/gen-verbs-bindings.sh
pipes it through this; idempotent, so it may be rerun on the committed file).

glibc's pthread_mutex_t is 40 bytes on x86_64 and 48 on aarch64 (pthread_cond_t is 48 on both), and
verbs structs embed it (ibv_context.mutex sits before abi_compat, which rivet reads). So:
- pthread_mutex_t becomes an opaque, 8-aligned byte array of the target's size;
- bindgen's layout assertions, which encode x86_64 offsets, apply on x86_64 only (src/sys/verbs.rs
  asserts the aarch64 offsets rivet relies on).
"""
import re
import sys

path = sys.argv[1]
s = open(path).read()

mutex = re.compile(r"#\[repr\(C\)\]\n#\[derive\(Copy, Clone\)\]\npub union pthread_mutex_t \{.*?\n\}\n"
                   r"#\[allow\(clippy::unnecessary_operation, clippy::identity_op\)\]\nconst _: \(\) = \{.*?\n\};\n", re.S)
opaque = """/// glibc's pthread_mutex_t, opaque: 40 bytes on x86_64, 48 on aarch64 (ci/verbs-bindings-fixup.py).
#[repr(C, align(8))]
#[derive(Copy, Clone)]
pub struct pthread_mutex_t {
    pub __size: [u8; PTHREAD_MUTEX_T_SIZE],
}
#[cfg(target_arch = "x86_64")]
pub const PTHREAD_MUTEX_T_SIZE: usize = 40;
#[cfg(target_arch = "aarch64")]
pub const PTHREAD_MUTEX_T_SIZE: usize = 48;
"""
if "PTHREAD_MUTEX_T_SIZE" not in s:
    s, n = mutex.subn(opaque, s)
    assert n == 1, "pthread_mutex_t not found"
    # The x86_64 layout of glibc's mutex internals is not needed by anything else.
    s = re.sub(r"#\[repr\(C\)\]\n#\[derive\(Copy, Clone\)\]\npub struct __pthread_mutex_s \{.*?\n\}\n"
               r"#\[allow\(clippy::unnecessary_operation, clippy::identity_op\)\]\nconst _: \(\) = \{.*?\n\};\n", "", s, flags=re.S)
gate = '#[cfg(target_arch = "x86_64")]\n'
s = re.sub(r"(?<!" + re.escape(gate) + r")#\[allow\(clippy::unnecessary_operation, clippy::identity_op\)\]\nconst _: \(\) = \{",
           gate + "#[allow(clippy::unnecessary_operation, clippy::identity_op)]\nconst _: () = {", s)
open(path, "w").write(s)
