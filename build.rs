// NCCL dlopens "libnccl-net-<name>.so": give the cdylib that SONAME so that a copy or symlink under
// that name (and an LD_PRELOADed copy, which the dynamic loader matches by SONAME) is found.
// `-z nodelete` keeps the library mapped after NCCL 2.27+ dlcloses it, so no code or static it handed
// out (logger state, thread-local destructors) can be unmapped under a running process.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-rivet.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
