/* Part of nccl-tests/conformance.c (one translation unit: every helper stays static, and the
 * build is one cc command). Includes, limits, options, and small utilities (logging, patterns, fd and thread counts). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../include/rivet_net.h"

#define MAX_RANKS   8
#define MAX_GROUP   8
#define HSIZE       NCCL_NET_HANDLE_MAXSIZE
#define CONN_TIMEOUT 10.0
#define KiB (1024UL)
#define MiB (1024UL * 1024UL)

typedef struct {
  const char* lib;
  int api;
  int dev;
  int dev2; /* device of odd ranks */
  /* --fuse A,B / --fuse2 C,D: each rank makes a virtual NIC of these physical devices with
   * makeVDevice (v9+) after init and uses it instead of --dev / --dev2 */
  int fuse[8], nfuse;
  int fuse2[8], nfuse2;
  int verbose;
  int rivet_timeout; /* seconds, from RIVET_TIMEOUT (default 10) */
} Opts;

/* ===================================================================== */
/* Small utilities                                                       */
/* ===================================================================== */

static int g_verbose; /* set once from -v before anything runs; read by the logger */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Copies of this process's last WARN messages (the plugin's own text, without our prefix), so a
 * case can check what the plugin said.  Written under the stderr lock, which the logger holds. */
#define NWARN    8
#define WARN_LEN 1024
static char g_warns[NWARN][WARN_LEN];
static unsigned g_nwarns; /* total WARNs seen; g_warns[(g_nwarns - 1) % NWARN] is the latest */

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  static const char* names[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  if (!g_verbose && level != NCCL_LOG_WARN) return;
  const char* lv = ((unsigned)level < 6) ? names[level] : "?";
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt ? fmt : "", ap);
  va_end(ap);
  flockfile(stderr);
  if (level == NCCL_LOG_WARN) {
    snprintf(g_warns[g_nwarns % NWARN], WARN_LEN, "%.*s", WARN_LEN - 1, msg);
    g_nwarns++;
  }
  fprintf(stderr, "[pid %d] plugin %s (flags 0x%lx) %s:%d %s\n", (int)getpid(), lv, flags,
          file ? file : "?", line, msg);
  funlockfile(stderr);
}

/* The latest kept WARN message containing both `a` and `b` (into out), or -1. */
static int warn_find(const char* a, const char* b, char* out, size_t ol) {
  int found = -1;
  flockfile(stderr);
  unsigned n = g_nwarns < NWARN ? g_nwarns : NWARN;
  for (unsigned i = 0; i < n && found < 0; i++) {
    const char* m = g_warns[(g_nwarns - 1 - i) % NWARN];
    if (strstr(m, a) && strstr(m, b)) {
      snprintf(out, ol, "%s", m);
      found = 0;
    }
  }
  funlockfile(stderr);
  return found;
}

/* The latest kept WARN message, or "" (into out). */
static void warn_last(char* out, size_t ol) {
  flockfile(stderr);
  snprintf(out, ol, "%s", g_nwarns ? g_warns[(g_nwarns - 1) % NWARN] : "");
  funlockfile(stderr);
}

/* Deterministic byte pattern: depends on seed and index, not periodic. */
static inline uint8_t pat(uint32_t seed, size_t i) {
  uint32_t x = seed * 0x9E3779B1u + (uint32_t)i * 0x85EBCA6Bu + (uint32_t)(i >> 32);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return (uint8_t)(x ^ (x >> 24));
}
static uint32_t seed3(uint32_t a, uint32_t b, uint32_t c) {
  return a * 73856093u ^ b * 19349663u ^ c * 83492791u ^ 0x5bd1e995u;
}
static void fill(void* buf, size_t n, uint32_t seed) {
  uint8_t* p = buf;
  for (size_t i = 0; i < n; i++) p[i] = pat(seed, i);
}
/* Returns index of first mismatch or -1. */
static long check(const void* buf, size_t n, uint32_t seed) {
  const uint8_t* p = buf;
  for (size_t i = 0; i < n; i++)
    if (p[i] != pat(seed, i)) return (long)i;
  return -1;
}

static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory stream's own fd */
}

static int count_threads(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

static int read_full(int fd, void* buf, size_t len) {
  uint8_t* p = buf;
  while (len) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}
static int write_full(int fd, const void* buf, size_t len) {
  const uint8_t* p = buf;
  while (len) {
    ssize_t r = write(fd, p, len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}
