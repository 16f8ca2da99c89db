/* NCCL applies /etc/nccl.conf, ~/.nccl.conf and NCCL_CONF_FILE with setenv() (a variable already
 * in the environment wins) before it loads its net plugin. This driver does the same, in that
 * order: setenv, dlopen, then init through ncclNetPlugin_v8; with --late, setenv comes after
 * dlopen and before init. It prints init's result and the WARN lines the plugin logged.
 * Usage: confenv LIB NAME VALUE [--late] */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../include/rivet_net.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  printf("WARN ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

int main(int argc, char** argv) {
  if (argc < 4) { fprintf(stderr, "usage: confenv LIB NAME VALUE [--late]\n"); return 2; }
  int late = argc > 4 && strcmp(argv[4], "--late") == 0;
  if (!late) setenv(argv[2], argv[3], 0);
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
  const ncclNet_v8_t* net = (const ncclNet_v8_t*)dlsym(h, "ncclNetPlugin_v8");
  if (!net) { printf("no ncclNetPlugin_v8\n"); return 1; }
  if (late) setenv(argv[2], argv[3], 0);
  ncclResult_t r = net->init(logger);
  int n = -1;
  if (r == ncclSuccess) net->devices(&n);
  printf("init %d devices %d\n", (int)r, n);
  fflush(stdout);
  return 0;
}
