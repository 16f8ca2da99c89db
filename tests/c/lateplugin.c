/* A stand-in ncclNet plugin for tests/cli.rs, shaped like NCCL's IB transport built as a plugin
 * (nccl-rdma-sharp-plugins): its exported ncclNetPlugin_v11 holds only a name and init, and init
 * fills in the rest of the table; init also calls the logger without checking it, as plugins do
 * (NCCL always passes one). A driver that reads the table before init, or passes no logger,
 * fails on it. One device; every other function is a stub that fails (`rivet info` calls none). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
/* The header declares rivet's own (const) tables; this file defines a table of its own. */
#define ncclNetPlugin_v11 rivet_declared_v11
#include "../../include/rivet_net.h"
#undef ncclNetPlugin_v11

static ncclResult_t late_devices(int* n) { *n = 1; return ncclSuccess; }
static ncclResult_t late_props(int dev, ncclNetProperties_v11_t* p) {
  (void)dev;
  memset(p, 0, sizeof *p);
  p->name = "late0";
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 1234;
  p->maxComms = 1;
  p->maxRecvs = 1;
  return ncclSuccess;
}
static ncclResult_t late_init(void** ctx, uint64_t id, ncclNetCommConfig_v11_t* cfg, ncclDebugLogger_t log,
                              ncclProfilerCallback_t prof);
static ncclResult_t late_stub(void) { return ncclInternalError; }
#define STUB(f) ncclNetPlugin_v11.f = (__typeof__(ncclNetPlugin_v11.f))(void*)late_stub

ncclNet_v11_t ncclNetPlugin_v11 = { .name = "late", .init = late_init };

static ncclResult_t late_init(void** ctx, uint64_t id, ncclNetCommConfig_v11_t* cfg, ncclDebugLogger_t log,
                              ncclProfilerCallback_t prof) {
  (void)id; (void)cfg; (void)prof;
  log(NCCL_LOG_INFO, NCCL_NET, __FILE__, __LINE__, "late plugin init %d", 11);
  *ctx = &ncclNetPlugin_v11;
  ncclNetPlugin_v11.devices = late_devices;
  ncclNetPlugin_v11.getProperties = late_props;
  STUB(listen); STUB(connect); STUB(accept); STUB(regMr); STUB(regMrDmaBuf); STUB(deregMr);
  STUB(isend); STUB(irecv); STUB(iflush); STUB(test); STUB(closeSend); STUB(closeRecv);
  STUB(closeListen); STUB(finalize);
  return ncclSuccess;
}
