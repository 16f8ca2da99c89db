/* Part of nccl-tests/conformance.c (one translation unit: every helper stays static, and the
 * build is one cc command). Ranks: the child side of the parent channel; connections, buffers and operations; the parent spawning ranks. */
/* ===================================================================== */
/* Child side: ranks, parent channel                                      */
/* ===================================================================== */

/* Child -> parent messages: 'H' + handle, 'B' barrier, 'K' + int rank (kill it),
 * 'D' + DETAIL_LEN text (detail / failure reason).
 * Parent -> child: 'T' + n handles, 'B' barrier release, 'k' a rank was killed. */
#define DETAIL_LEN 240

typedef struct {
  const Opts* o;
  int rank, n;
  int wfd, rfd;      /* to / from parent */
  int peer_killed;   /* got a 'k' notice */
  Net net;
  void* ctx;
  int dev;
} Child;

static void child_msg(Child* c, char tag, const void* payload, size_t len) {
  uint8_t buf[1 + MAX_RANKS * HSIZE];
  buf[0] = (uint8_t)tag;
  memcpy(buf + 1, payload, len);
  if (write_full(c->wfd, buf, 1 + len) != 0) _exit(3);
}

static void child_detail(Child* c, const char* fmt, ...) {
  char d[DETAIL_LEN];
  memset(d, 0, sizeof d);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d, sizeof d, fmt, ap);
  va_end(ap);
  child_msg(c, 'D', d, sizeof d);
}

#define FAIL(c, ...)                                                      \
  do {                                                                    \
    child_detail((c), __VA_ARGS__);                                       \
    fprintf(stderr, "  [rank %d] ", (c)->rank);                           \
    fprintf(stderr, __VA_ARGS__);                                         \
    fputc('\n', stderr);                                                  \
    return 1;                                                             \
  } while (0)

/* Read one message tag from the parent, bounded; 'k' notices are absorbed. */
static int child_read_tag(Child* c, char want, double timeout) {
  double end = now_s() + timeout;
  for (;;) {
    double left = end - now_s();
    if (left <= 0) return -1;
    struct pollfd pf = {.fd = c->rfd, .events = POLLIN};
    int r = poll(&pf, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char t;
    if (read_full(c->rfd, &t, 1) != 0) return -1;
    if (t == 'k') { c->peer_killed = 1; continue; }
    return t == want ? 0 : -1;
  }
}

static void child_check_kill_notice(Child* c) {
  struct pollfd pf = {.fd = c->rfd, .events = POLLIN};
  while (poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN)) {
    char t;
    if (read_full(c->rfd, &t, 1) != 0) return;
    if (t == 'k') c->peer_killed = 1;
  }
}

static int child_barrier(Child* c) {
  child_msg(c, 'B', NULL, 0);
  return child_read_tag(c, 'B', 60);
}

/* Send own handle, receive everyone's. */
static int child_exchange(Child* c, const void* mine, uint8_t all[][HSIZE]) {
  child_msg(c, 'H', mine, HSIZE);
  if (child_read_tag(c, 'T', 60) != 0) return -1;
  return read_full(c->rfd, all, (size_t)c->n * HSIZE);
}

/* With --fuse/--fuse2: make this rank's virtual NIC (as NCCL does at init, before any comm)
 * and check what getProperties says of it; c->dev becomes its index. */
static int child_fuse(Child* c) {
  const int* f = (c->rank % 2) ? c->o->fuse2 : c->o->fuse;
  int n = (c->rank % 2) ? c->o->nfuse2 : c->o->nfuse;
  if (n == 0) return 0;
  if (c->o->api < 9) FAIL(c, "--fuse needs ncclNet v9+ (makeVDevice), api is %d", c->o->api);
  if (n > (c->o->api < 12 ? 4 : 8)) FAIL(c, "--fuse of %d devices: ncclNet v%d carries at most %d", n, c->o->api, c->o->api < 12 ? 4 : 8);
  int d = -1;
  ncclResult_t r = net_make_vdevice(&c->net, f, n, &d);
  if (r != ncclSuccess) FAIL(c, "makeVDevice of %d devices returned %d", n, r);
  int d2 = -1;
  r = net_make_vdevice(&c->net, f, n, &d2);
  if (r != ncclSuccess || d2 != d) FAIL(c, "makeVDevice again of the same devices gave %d (rc %d), first %d", d2, r, d);
  int ndev = 0;
  if (c->net.devices(&ndev) != ncclSuccess || d < 0 || d >= ndev) FAIL(c, "virtual device %d, devices() says %d", d, ndev);
  Props p;
  if (net_props(&c->net, d, &p) != ncclSuccess) FAIL(c, "getProperties of virtual device %d failed", d);
  if (p.vndevs != n) FAIL(c, "virtual device %d: vProps.ndevs %d, want %d", d, p.vndevs, n);
  int speed = 0;
  for (int i = 0; i < n; i++) {
    if (p.vdevs[i] != f[i]) FAIL(c, "virtual device %d: vProps.devs[%d] %d, want %d", d, i, p.vdevs[i], f[i]);
    Props m;
    if (net_props(&c->net, f[i], &m) != ncclSuccess) FAIL(c, "getProperties of member %d failed", f[i]);
    if (!strstr(p.name, m.name)) FAIL(c, "virtual device %d is named %s, without member %s", d, p.name, m.name);
    speed += m.speed;
  }
  if (p.speed != speed) FAIL(c, "virtual device %d: speed %d, want the members' sum %d", d, p.speed, speed);
  c->dev = d;
  return 0;
}

static int child_open(Child* c) {
  char err[256];
  if (net_load(&c->net, c->o->lib, c->o->api, err, sizeof err) != 0) FAIL(c, "%s", err);
  ncclResult_t r = net_init(&c->net, &c->ctx, 0x7100 + (uint64_t)c->rank);
  if (r != ncclSuccess) FAIL(c, "init returned %d", r);
  if ((c->o->api >= 11) && c->ctx == NULL) FAIL(c, "init returned success but ctx == NULL");
  return child_fuse(c);
}

static int child_finalize(Child* c) {
  ncclResult_t r = net_finalize(&c->net, c->ctx);
  c->ctx = NULL;
  if (r != ncclSuccess) FAIL(c, "finalize returned %d", r);
  return 0;
}

/* ===================================================================== */
/* Connections, buffers, operations                                       */
/* ===================================================================== */

typedef struct {
  void* lc; /* listen comm */
  void* sc; /* send comm to next rank */
  void* rc; /* recv comm from previous rank */
} Conn;

/* Connect to `handle` and accept on `lc` together (either may be skipped by
 * passing NULL out-pointers), alternating non-blocking calls in one loop. */
static int connect_accept(Child* c, void* handle, void** sc, void* lc, void** rc, char* err,
                          size_t el) {
  ncclNetDeviceHandle_v7_t *sdev = NULL, *rdev = NULL;
  double end = now_s() + CONN_TIMEOUT;
  if (sc) *sc = NULL;
  if (rc) *rc = NULL;
  unsigned spins = 0;
  while ((sc && !*sc) || (rc && !*rc)) {
    if (sc && !*sc) {
      ncclResult_t r = net_connect(&c->net, c->ctx, c->dev, handle, sc, &sdev);
      if (r != ncclSuccess) { snprintf(err, el, "connect returned %d", r); return -1; }
    }
    if (rc && !*rc) {
      ncclResult_t r = net_accept(&c->net, lc, rc, &rdev);
      if (r != ncclSuccess) { snprintf(err, el, "accept returned %d", r); return -1; }
    }
    if (now_s() > end) {
      snprintf(err, el, "connection not established within %.0f s (send %s, recv %s)",
               CONN_TIMEOUT, sc ? (*sc ? "up" : "pending") : "-",
               rc ? (*rc ? "up" : "pending") : "-");
      return -1;
    }
    if (++spins % 64 == 0) usleep(200);
  }
  if (sdev || rdev) {
    snprintf(err, el, "host plugin wrote a device handle (send %p recv %p)", (void*)sdev,
             (void*)rdev);
    return -1;
  }
  return 0;
}

/* listen, exchange handles, connect to (rank+1)%n, accept from own listen comm. */
static int ring_setup(Child* c, Conn* k) {
  char err[200];
  uint8_t handle[HSIZE], all[MAX_RANKS][HSIZE];
  memset(k, 0, sizeof *k);
  memset(handle, 0, sizeof handle);
  ncclResult_t r = net_listen(&c->net, c->ctx, c->dev, handle, &k->lc);
  if (r != ncclSuccess) FAIL(c, "listen(dev %d) returned %d", c->dev, r);
  if (!k->lc) FAIL(c, "listen returned success but listenComm == NULL");
  if (child_exchange(c, handle, all) != 0) FAIL(c, "handle exchange with parent failed");
  if (connect_accept(c, all[(c->rank + 1) % c->n], &k->sc, k->lc, &k->rc, err, sizeof err))
    FAIL(c, "%s", err);
  return 0;
}

static int conn_close(Child* c, Conn* k) {
  ncclResult_t r1 = ncclSuccess, r2 = ncclSuccess, r3 = ncclSuccess;
  if (k->sc) r1 = c->net.closeSend(k->sc);
  if (k->rc) r2 = c->net.closeRecv(k->rc);
  if (k->lc) r3 = c->net.closeListen(k->lc);
  memset(k, 0, sizeof *k);
  if (r1 || r2 || r3) FAIL(c, "close returned send %d recv %d listen %d", r1, r2, r3);
  return 0;
}

typedef struct {
  uint8_t* p;
  size_t len; /* allocated and registered length (page multiple, >= 4096) */
  void* mh;
  void* comm;
} Buf;

static int buf_get(Child* c, void* comm, size_t size, Buf* b) {
  memset(b, 0, sizeof *b);
  b->len = (size + 4095) & ~(size_t)4095;
  if (b->len == 0) b->len = 4096;
  void* p = NULL;
  if (posix_memalign(&p, 4096, b->len) != 0) FAIL(c, "posix_memalign(%zu) failed", b->len);
  b->p = p;
  memset(b->p, 0, b->len);
  b->comm = comm;
  ncclResult_t r = net_regmr(&c->net, comm, b->p, b->len, NCCL_PTR_HOST, &b->mh);
  if (r != ncclSuccess) {
    free(p);
    b->p = NULL;
    FAIL(c, "regMr(%zu bytes, HOST) returned %d", b->len, r);
  }
  return 0;
}

static int buf_put(Child* c, Buf* b) {
  ncclResult_t r = ncclSuccess;
  if (b->p) {
    r = c->net.deregMr(b->comm, b->mh);
    free(b->p);
  }
  memset(b, 0, sizeof *b);
  if (r != ncclSuccess) FAIL(c, "deregMr returned %d", r);
  return 0;
}

enum { OP_SEND, OP_RECV };

typedef struct {
  int kind;
  void* comm;
  int n;
  void* data[MAX_GROUP];
  size_t size[MAX_GROUP];
  int isize[MAX_GROUP];
  int tag[MAX_GROUP];
  void* mh[MAX_GROUP];
  int optional; /* preset *request = NCCL_NET_OPTIONAL_RECV_COMPLETION */
  /* state */
  void* req;
  int posted, done, retries;
  int got[MAX_GROUP];
  ncclResult_t err;
} Op;

static void op_send(Op* op, void* comm, Buf* b, size_t size, int tag) {
  memset(op, 0, sizeof *op);
  op->kind = OP_SEND;
  op->comm = comm;
  op->n = 1;
  op->data[0] = b->p;
  op->size[0] = size;
  op->tag[0] = tag;
  op->mh[0] = b->mh;
}
static void op_recv(Op* op, void* comm, Buf* b, size_t size, int tag) {
  op_send(op, comm, b, size, tag);
  op->kind = OP_RECV;
}

/* 1 posted, 0 try again later, -1 error (op->err set). */
static int op_post(Child* c, Op* op, char* err, size_t el) {
  void* req = op->optional ? (void*)(uintptr_t)NCCL_NET_OPTIONAL_RECV_COMPLETION : NULL;
  ncclResult_t r;
  if (op->kind == OP_SEND)
    r = net_isend(&c->net, op->comm, op->data[0], op->size[0], op->tag[0], op->mh[0], &req);
  else
    r = net_irecv(&c->net, op->comm, op->n, op->data, op->size, op->isize, op->tag, op->mh, &req);
  if (r != ncclSuccess) {
    op->err = r;
    snprintf(err, el, "%s returned %d", op->kind == OP_SEND ? "isend" : "irecv", r);
    return -1;
  }
  if (op->optional && req == (void*)(uintptr_t)NCCL_NET_OPTIONAL_RECV_COMPLETION) {
    op->err = ncclInternalError;
    snprintf(err, el, "irecv left the OPTIONAL_RECV_COMPLETION marker as the request");
    return -1;
  }
  if (!req) { op->retries++; return 0; }
  op->req = req;
  op->posted = 1;
  return 1;
}

/* 1 done, 0 not yet, -1 error. */
static int op_test(Child* c, Op* op, char* err, size_t el) {
  int done = 0;
  ncclResult_t r = c->net.test(op->req, &done, op->got);
  if (r != ncclSuccess) {
    op->err = r;
    snprintf(err, el, "test(%s) returned %d", op->kind == OP_SEND ? "send" : "recv", r);
    return -1;
  }
  if (done) op->done = 1;
  return done ? 1 : 0;
}

/* Drive ops until all are done.  Posts in array order per comm (a later op on
 * the same comm is not posted before an earlier one), posts everything
 * postable before testing.  Resumable: state lives in the ops.
 * Returns 0 all done, >0 the ncclResult_t of the first failing op (*bad = idx),
 * -1 on timeout. */
static int ops_run(Child* c, Op* ops, int nops, double timeout, char* err, size_t el, int* bad) {
  double end = now_s() + timeout;
  unsigned idle = 0;
  if (bad) *bad = -1;
  for (;;) {
    int pending = 0, progress = 0;
    for (int i = 0; i < nops; i++) {
      if (ops[i].posted) continue;
      int blocked = 0;
      for (int j = 0; j < i; j++)
        if (!ops[j].posted && ops[j].comm == ops[i].comm && ops[j].kind == ops[i].kind) blocked = 1;
      if (blocked) continue;
      int r = op_post(c, &ops[i], err, el);
      if (r < 0) { if (bad) *bad = i; return ops[i].err ? (int)ops[i].err : 3; }
      progress |= r;
    }
    for (int i = 0; i < nops; i++) {
      if (ops[i].done) continue;
      pending = 1;
      if (!ops[i].posted) continue;
      int r = op_test(c, &ops[i], err, el);
      if (r < 0) { if (bad) *bad = i; return (int)ops[i].err; }
      progress |= r;
    }
    if (!pending) return 0;
    if (now_s() > end) {
      int np = 0, nd = 0;
      for (int i = 0; i < nops; i++) { np += ops[i].posted; nd += ops[i].done; }
      snprintf(err, el, "timeout after %.1f s: %d ops, %d posted, %d done", timeout, nops, np, nd);
      return -1;
    }
    if (!progress && ++idle % 32 == 0) usleep(50);
  }
}

/* Post a receive and a send together and complete both. */
static int xfer(Child* c, Buf* sb, size_t ssize, Buf* rb, size_t rsize, int tag, int* got) {
  char err[200];
  Op ops[2];
  int n = 0;
  if (rb) op_recv(&ops[n++], rb->comm, rb, rsize, tag);
  if (sb) op_send(&ops[n++], sb->comm, sb, ssize, tag);
  int r = ops_run(c, ops, n, 30, err, sizeof err, NULL);
  if (r != 0) FAIL(c, "transfer send %zu / recv %zu: %s", ssize, rsize, err);
  if (rb && got) *got = ops[0].got[0];
  return 0;
}

/* ===================================================================== */
/* Parent side: spawning ranks                                           */
/* ===================================================================== */

typedef int (*ChildFn)(Child* c, void* arg);

typedef struct {
  pid_t pid;
  int rfd, wfd; /* from / to child */
  int open, exited, expect_kill;
  int status;
  char detail[DETAIL_LEN];
} Rank;

static void parent_broadcast(Rank* rk, int n, const void* msg, size_t len) {
  for (int i = 0; i < n; i++)
    if (!rk[i].exited && !rk[i].expect_kill) (void)write_full(rk[i].wfd, msg, len);
}

/* Fork n ranks running fn; serve handle exchange / barrier / kill requests;
 * wait for all with a deadline.  Returns 0 if every rank succeeded. */
static int spawn(const Opts* o, int n, ChildFn fn, void* arg, double timeout, char* out,
                 size_t ol) {
  Rank rk[MAX_RANKS];
  memset(rk, 0, sizeof rk);
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < n; i++) {
    int up[2], down[2];
    if (pipe(up) || pipe(down)) { snprintf(out, ol, "pipe: %s", strerror(errno)); return 1; }
    pid_t pid = fork();
    if (pid < 0) { snprintf(out, ol, "fork: %s", strerror(errno)); return 1; }
    if (pid == 0) {
      for (int j = 0; j < i; j++) { close(rk[j].rfd); close(rk[j].wfd); }
      close(up[0]);
      close(down[1]);
      signal(SIGPIPE, SIG_DFL);
      alarm(120 + 2 * (unsigned)o->rivet_timeout);
      Child c;
      memset(&c, 0, sizeof c);
      c.o = o; c.rank = i; c.n = n; c.wfd = up[1]; c.rfd = down[0]; c.dev = (i % 2) ? o->dev2 : o->dev;
      int rc = fn(&c, arg);
      fflush(stdout);
      fflush(stderr);
      exit(rc ? 1 : 0);
    }
    close(up[1]);
    close(down[0]);
    rk[i].pid = pid; rk[i].rfd = up[0]; rk[i].wfd = down[1]; rk[i].open = 1;
  }

  uint8_t handles[MAX_RANKS][HSIZE];
  int nh = 0, nb = 0, alive = n, timed_out = 0;
  double end = now_s() + timeout;
  while (alive > 0) {
    struct pollfd pf[MAX_RANKS];
    int idx[MAX_RANKS], np = 0;
    for (int i = 0; i < n; i++)
      if (rk[i].open) { pf[np].fd = rk[i].rfd; pf[np].events = POLLIN; idx[np++] = i; }
    if (np) poll(pf, (nfds_t)np, 50); else usleep(20000);
    for (int q = 0; q < np; q++) {
      if (!(pf[q].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank* r = &rk[idx[q]];
      char t;
      if (read_full(r->rfd, &t, 1) != 0) { r->open = 0; continue; }
      if (t == 'H') {
        if (read_full(r->rfd, handles[idx[q]], HSIZE) != 0) { r->open = 0; continue; }
        if (++nh == n) {
          uint8_t msg[1 + MAX_RANKS * HSIZE];
          msg[0] = 'T';
          memcpy(msg + 1, handles, (size_t)n * HSIZE);
          parent_broadcast(rk, n, msg, 1 + (size_t)n * HSIZE);
          nh = 0;
        }
      } else if (t == 'B') {
        if (++nb == n) { parent_broadcast(rk, n, "B", 1); nb = 0; }
      } else if (t == 'K') {
        int victim;
        if (read_full(r->rfd, &victim, sizeof victim) != 0) { r->open = 0; continue; }
        if (victim >= 0 && victim < n && !rk[victim].exited) {
          rk[victim].expect_kill = 1;
          kill(rk[victim].pid, SIGKILL);
          parent_broadcast(rk, n, "k", 1);
        }
      } else if (t == 'D') {
        if (read_full(r->rfd, r->detail, DETAIL_LEN) != 0) { r->open = 0; continue; }
        r->detail[DETAIL_LEN - 1] = 0;
      } else {
        r->open = 0;
      }
    }
    for (int i = 0; i < n; i++) {
      if (rk[i].exited) continue;
      if (waitpid(rk[i].pid, &rk[i].status, WNOHANG) == rk[i].pid) { rk[i].exited = 1; alive--; }
    }
    if (alive > 0 && now_s() > end) {
      timed_out = 1;
      for (int i = 0; i < n; i++)
        if (!rk[i].exited) kill(rk[i].pid, SIGKILL);
      for (int i = 0; i < n; i++)
        if (!rk[i].exited) { waitpid(rk[i].pid, &rk[i].status, 0); rk[i].exited = 1; }
      alive = 0;
    }
  }
  /* drain detail messages still buffered in pipes */
  for (int i = 0; i < n; i++) {
    char t;
    while (rk[i].open && read_full(rk[i].rfd, &t, 1) == 0) {
      if (t == 'D') { if (read_full(rk[i].rfd, rk[i].detail, DETAIL_LEN)) break; rk[i].detail[DETAIL_LEN-1] = 0; }
      else if (t == 'H') { uint8_t h[HSIZE]; if (read_full(rk[i].rfd, h, HSIZE)) break; }
      else if (t == 'K') { int v; if (read_full(rk[i].rfd, &v, sizeof v)) break; }
    }
    close(rk[i].rfd);
    close(rk[i].wfd);
  }

  int failed = 0;
  size_t pos = 0;
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    int st = rk[i].status;
    char why[DETAIL_LEN + 64];
    int bad = 0;
    if (rk[i].expect_kill && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      snprintf(why, sizeof why, "killed as planned");
    } else if (timed_out && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      bad = 1;
      snprintf(why, sizeof why, "hung: killed after %.0f s deadline%s%s", timeout,
               rk[i].detail[0] ? "; last: " : "", rk[i].detail);
    } else if (WIFSIGNALED(st)) {
      bad = 1;
      snprintf(why, sizeof why, "died with signal %d (%s)%s%s", WTERMSIG(st),
               strsignal(WTERMSIG(st)), rk[i].detail[0] ? "; last: " : "", rk[i].detail);
    } else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      bad = 1;
      snprintf(why, sizeof why, "%s", rk[i].detail[0] ? rk[i].detail : "exited with failure");
    } else {
      snprintf(why, sizeof why, "%s", rk[i].detail);
    }
    if (bad && !failed) { failed = 1; pos = 0; out[0] = 0; }
    if (bad == failed && why[0] && pos < ol) {
      char prefix[16] = "";
      if (n > 1) snprintf(prefix, sizeof prefix, "r%d: ", i);
      pos += (size_t)snprintf(out + pos, ol - pos, "%s%s%s", pos ? "; " : "", prefix, why);
    }
  }
  return failed;
}
