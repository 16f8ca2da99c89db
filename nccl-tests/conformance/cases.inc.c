/* Part of nccl-tests/conformance.c (one translation unit: every helper stays static, and the
 * build is one cc command). The data cases: props, sizes, bigrecv, late, outstanding, group, ring, closeinflight, reuse. */
/* ===================================================================== */
/* Cases                                                                 */
/* ===================================================================== */

/* ---- props ---------------------------------------------------------- */
static int child_props(Child* c, void* arg) {
  (void)arg;
  if (child_open(c)) return 1;
  int api = c->o->api, ndev = -1;
  ncclResult_t r = c->net.devices(&ndev);
  if (r != ncclSuccess) FAIL(c, "devices returned %d", r);
  if (ndev <= 0) FAIL(c, "devices reported %d devices", ndev);
  Props p0;
  memset(&p0, 0, sizeof p0);
  for (int d = 0; d < ndev; d++) {
    Props p;
    r = net_props(&c->net, d, &p);
    if (r != ncclSuccess) FAIL(c, "getProperties(%d) returned %d", d, r);
    if (!p.name || !p.name[0]) FAIL(c, "dev %d: name is NULL or empty", d);
    if (!(p.ptrSupport & NCCL_PTR_HOST)) FAIL(c, "dev %d: ptrSupport 0x%x lacks HOST", d, p.ptrSupport);
    if (p.speed <= 0) FAIL(c, "dev %d: speed %d", d, p.speed);
    if (p.maxComms <= 0) FAIL(c, "dev %d: maxComms %d", d, p.maxComms);
    if (p.maxRecvs < 1 || p.maxRecvs > 8) FAIL(c, "dev %d: maxRecvs %d not in [1,8]", d, p.maxRecvs);
    if (!(p.latency >= 0)) FAIL(c, "dev %d: latency %f", d, (double)p.latency);
    if (api >= 7 && (p.netDeviceType != 0 || p.netDeviceVersion != 0))
      FAIL(c, "dev %d: netDeviceType %d / netDeviceVersion %d, want 0/0", d, p.netDeviceType,
           p.netDeviceVersion);
    if (api >= 9) {
      if (p.maxP2pBytes == 0 || p.maxP2pBytes > (size_t)NCCL_MAX_NET_SIZE_BYTES)
        FAIL(c, "dev %d: maxP2pBytes %zu not in (0, 1 TiB]", d, p.maxP2pBytes);
      /* A physical device is its own one member; the virtual one this rank made (--fuse) was
       * checked when it was made (child_fuse). */
      int fused = (c->rank % 2 ? c->o->nfuse2 : c->o->nfuse) > 0 && d == c->dev;
      if (!fused && (p.vndevs != 1 || p.vdevs[0] != d))
        FAIL(c, "dev %d: vProps {ndevs %d, devs[0] %d}, want {1, %d}", d, p.vndevs, p.vdevs[0], d);
    }
    if (d == c->dev || d == 0) p0 = p;
  }
  Props bad;
  r = net_props(&c->net, ndev, &bad);
  if (r == ncclSuccess) FAIL(c, "getProperties(%d) with ndev=%d returned success", ndev, ndev);

  void* ctx2 = NULL;
  r = net_init(&c->net, &ctx2, 0x7200);
  if (r != ncclSuccess) FAIL(c, "second init returned %d", r);
  if (api >= 11) {
    if (!ctx2) FAIL(c, "second init gave ctx NULL");
    if (ctx2 == c->ctx) FAIL(c, "second init returned the same ctx %p", ctx2);
    r = net_finalize(&c->net, ctx2);
    if (r != ncclSuccess) FAIL(c, "finalize(ctx2) returned %d", r);
  }
  if (child_finalize(c)) return 1;
  char extra[80] = "";
  if (api >= 9) snprintf(extra, sizeof extra, " maxP2pBytes=%zu", p0.maxP2pBytes);
  if (api >= 12) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " rail=%d plane=%d",
                          p0.railId, p0.planeId);
  child_detail(c, "ndev=%d name=%s speed=%d lat=%.1f maxComms=%d maxRecvs=%d ptr=0x%x%s%s", ndev,
               p0.name, p0.speed, (double)p0.latency, p0.maxComms, p0.maxRecvs, p0.ptrSupport,
               extra, p0.pciPath ? "" : " pci=NULL");
  return 0;
}

/* ---- sizes ---------------------------------------------------------- */
static int child_sizes(Child* c, void* arg) {
  (void)arg;
  static const size_t sizes[] = {0, 1, 4095, 4096, 65536, 1 * MiB, 16 * MiB};
  const int ns = (int)(sizeof sizes / sizeof sizes[0]);
  Conn k;
  int flush_reqs = 0;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  int peer = (c->rank + c->n - 1) % c->n;
  for (int s = 0; s < ns; s++) {
    size_t sz = sizes[s];
    Buf sb, rb;
    if (buf_get(c, k.sc, sz, &sb) || buf_get(c, k.rc, sz, &rb)) return 1;
    fill(sb.p, sz, seed3((uint32_t)sz, (uint32_t)c->rank, 1));
    memset(rb.p, 0xA5, rb.len);
    int got = -1;
    if (xfer(c, &sb, sz, &rb, sz, 0, &got)) return 1;
    if ((size_t)got != sz) FAIL(c, "size %zu: test reported %d bytes", sz, got);
    long bad = check(rb.p, sz, seed3((uint32_t)sz, (uint32_t)peer, 1));
    if (bad >= 0) FAIL(c, "size %zu: received byte %ld wrong (0x%02x)", sz, bad, rb.p[bad]);
    if (sz > 0) {
      void* data[1] = {rb.p};
      int fs[1] = {(int)sz};
      void* mh[1] = {rb.mh};
      void* req = NULL;
      ncclResult_t r = c->net.iflush(k.rc, 1, data, fs, mh, &req);
      if (r != ncclSuccess) FAIL(c, "size %zu: iflush returned %d", sz, r);
      if (req) {
        flush_reqs++;
        Op f;
        memset(&f, 0, sizeof f);
        f.req = req; f.posted = 1; f.kind = OP_RECV; f.comm = k.rc; f.n = 1;
        char err[200];
        if (ops_run(c, &f, 1, 10, err, sizeof err, NULL)) FAIL(c, "size %zu: flush: %s", sz, err);
      }
    }
    if (buf_put(c, &sb) || buf_put(c, &rb)) return 1;
  }
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (conn_close(c, &k) || child_finalize(c)) return 1;
  /* Profiler events (v10+): each started one stopped once by the time the comms are closed; a
   * transport that reports them (RIVET_CONFORMANCE_NET_EVENTS=1: rivet's verbs) reports every
   * send and receive, and its sends' queue pairs carry exactly the bytes sent. */
  char prof[160] = "";
  if (c->o->api >= 10) {
    if (prof_bad) FAIL(c, "profiler: %ld malformed event(s); the first: %s", prof_bad, prof_why);
    if (prof_starts != prof_stops) FAIL(c, "profiler: %ld event(s) started, %ld stopped", prof_starts, prof_stops);
    const char* want = getenv("RIVET_CONFORMANCE_NET_EVENTS");
    if (want && !strcmp(want, "1")) {
      size_t sent = 0;
      for (int s = 0; s < ns; s++) sent += sizes[s];
      if (prof_starts < 2 * ns) FAIL(c, "profiler: %ld event(s) for %d sends and %d receives", prof_starts, ns, ns);
      if (prof_send_bytes != sent) FAIL(c, "profiler: send events carry %zu bytes, %zu were sent", prof_send_bytes, sent);
    }
    snprintf(prof, sizeof prof, ", %ld profiler event(s) started and stopped", prof_starts);
  }
  if (c->rank == 0)
    child_detail(c, "%d sizes 0..16MiB both directions%s%s", ns,
                 flush_reqs ? ", iflush returned non-NULL requests" : "", prof);
  return 0;
}

/* ---- bigrecv -------------------------------------------------------- */
static int child_bigrecv(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  const size_t sent = 1000, posted = 1 * MiB;
  uint32_t seed = seed3(1000, 0, 2);
  if (c->rank == 0) {
    Buf sb;
    if (buf_get(c, k.sc, sent, &sb)) return 1;
    fill(sb.p, sent, seed);
    if (xfer(c, &sb, sent, NULL, 0, 0, NULL) || buf_put(c, &sb)) return 1;
  } else {
    Buf rb;
    if (buf_get(c, k.rc, posted, &rb)) return 1;
    memset(rb.p, 0xC3, rb.len);
    int got = -1;
    if (xfer(c, NULL, 0, &rb, posted, 0, &got)) return 1;
    if (got != (int)sent) FAIL(c, "posted %zu, sender sent %zu, test reported %d", posted, sent, got);
    long bad = check(rb.p, sent, seed);
    if (bad >= 0) FAIL(c, "byte %ld of the 1000 received is wrong", bad);
    for (size_t i = sent; i < posted; i++)
      if (rb.p[i] != 0xC3) FAIL(c, "canary overwritten at byte %zu (0x%02x)", i, rb.p[i]);
    if (buf_put(c, &rb)) return 1;
    child_detail(c, "posted 1MiB, got %d, canary intact", got);
  }
  if (child_barrier(c)) FAIL(c, "barrier failed");
  return conn_close(c, &k) || child_finalize(c);
}

/* ---- late ------------------------------------------------------------ */
/* A receiver that is alive but late: rank 0 posts 4 x 16 MiB at once and keeps testing them;
 * rank 1 does not call the plugin for 2.5 x RIVET_TIMEOUT (a checkpoint, data loading), then
 * posts its receives. Everything must arrive intact: the sender waits, however late. */
#define NLATE 4
static int child_late(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  const size_t sz = 16 * MiB;
  double late = 2.5 * c->o->rivet_timeout, t0 = now_s();
  Buf b[NLATE];
  Op ops[NLATE];
  for (int i = 0; i < NLATE; i++) {
    if (buf_get(c, c->rank == 0 ? k.sc : k.rc, sz, &b[i])) return 1;
    if (c->rank == 0) {
      fill(b[i].p, sz, seed3((uint32_t)i, 0, 9));
      op_send(&ops[i], k.sc, &b[i], sz, i);
    } else {
      memset(b[i].p, 0xA5, sz);
      op_recv(&ops[i], k.rc, &b[i], sz, i);
    }
  }
  if (c->rank == 1) {
    double until = t0 + late;
    while (now_s() < until) usleep(100000);
  }
  char err[200];
  int bad = -1;
  if (ops_run(c, ops, NLATE, late + 60, err, sizeof err, &bad)) FAIL(c, "op %d after %.1f s: %s", bad, now_s() - t0, err);
  double took = now_s() - t0;
  if (c->rank == 1) {
    for (int i = 0; i < NLATE; i++) {
      if ((size_t)ops[i].got[0] != sz) FAIL(c, "recv %d: size %d, expected %zu", i, ops[i].got[0], sz);
      long x = check(b[i].p, sz, seed3((uint32_t)i, 0, 9));
      if (x >= 0) FAIL(c, "recv %d: byte %ld wrong", i, x);
    }
    child_detail(c, "receiver %.1f s late (2.5 x RIVET_TIMEOUT=%d), 4 x 16 MiB intact after %.1f s", late, c->o->rivet_timeout, took);
  }
  for (int i = 0; i < NLATE; i++)
    if (buf_put(c, &b[i])) return 1;
  if (child_barrier(c)) FAIL(c, "barrier failed");
  return conn_close(c, &k) || child_finalize(c);
}

/* ---- outstanding ---------------------------------------------------- */
#define NOUT 32
static int child_outstanding(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  int peer = (c->rank + c->n - 1) % c->n;
  Buf sb[NOUT], rb[NOUT];
  Op ops[2 * NOUT];
  size_t maxsz = 256 * KiB;
  for (int i = 0; i < NOUT; i++) {
    size_t sz = KiB << (i % 9); /* 1 KiB .. 256 KiB */
    if (buf_get(c, k.sc, sz, &sb[i]) || buf_get(c, k.rc, maxsz, &rb[i])) return 1;
    fill(sb[i].p, sz, seed3((uint32_t)i, (uint32_t)c->rank, 3));
    memset(rb[i].p, 0x5A, rb[i].len);
    op_recv(&ops[i], k.rc, &rb[i], maxsz, 0);
    op_send(&ops[NOUT + i], k.sc, &sb[i], sz, 0);
  }
  char err[200];
  int bad = -1;
  int r = ops_run(c, ops, 2 * NOUT, 30, err, sizeof err, &bad);
  if (r != 0) FAIL(c, "op %d: %s", bad, err);
  int retries = 0;
  for (int i = 0; i < NOUT; i++) {
    size_t sz = KiB << (i % 9);
    retries += ops[i].retries + ops[NOUT + i].retries;
    if ((size_t)ops[i].got[0] != sz) FAIL(c, "recv %d: size %d, expected %zu", i, ops[i].got[0], sz);
    long b = check(rb[i].p, sz, seed3((uint32_t)i, (uint32_t)peer, 3));
    if (b >= 0) FAIL(c, "recv %d: byte %ld wrong (message landed out of order?)", i, b);
  }
  for (int i = 0; i < NOUT; i++)
    if (buf_put(c, &sb[i]) || buf_put(c, &rb[i])) return 1;
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (conn_close(c, &k) || child_finalize(c)) return 1;
  child_detail(c, "32+32 in flight, %d back-pressure retries", retries);
  return 0;
}

/* ---- group ---------------------------------------------------------- */
static size_t group_size(int j, int round) { return 1000 + (size_t)j * 3001 + (size_t)round * 17; }

static int child_group(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c)) return 1;
  Props p;
  ncclResult_t pr = net_props(&c->net, c->dev, &p);
  if (pr != ncclSuccess) FAIL(c, "getProperties returned %d", pr);
  int n = p.maxRecvs > MAX_GROUP ? MAX_GROUP : p.maxRecvs;
  if (n <= 1) {
    child_detail(c, "skipped: maxRecvs=%d", p.maxRecvs);
    return child_finalize(c);
  }
  if (ring_setup(c, &k)) return 1;
  static const int perm8[8] = {7, 3, 0, 5, 1, 6, 2, 4};
  int tags[MAX_GROUP], m = 0;
  for (int i = 0; i < 8; i++)
    if (perm8[i] < n) tags[m++] = 100 + perm8[i];
  const size_t cap = 64 * KiB;
  for (int round = 0; round < 3; round++) {
    Buf b[MAX_GROUP];
    char err[200];
    if (c->rank == 0) { /* sender: n isends in tag order */
      Op ops[MAX_GROUP];
      for (int j = 0; j < n; j++) {
        size_t sz = group_size(j, round);
        if (buf_get(c, k.sc, sz, &b[j])) return 1;
        fill(b[j].p, sz, seed3(100 + (uint32_t)j, (uint32_t)round, 4));
        op_send(&ops[j], k.sc, &b[j], sz, 100 + j);
      }
      if (ops_run(c, ops, n, 30, err, sizeof err, NULL)) FAIL(c, "round %d: %s", round, err);
    } else { /* receiver: one grouped irecv with scrambled tags */
      Op op;
      memset(&op, 0, sizeof op);
      op.kind = OP_RECV;
      op.comm = k.rc;
      op.n = n;
      for (int i = 0; i < n; i++) {
        if (buf_get(c, k.rc, cap, &b[i])) return 1;
        memset(b[i].p, 0xEE, b[i].len);
        op.data[i] = b[i].p; op.size[i] = cap; op.tag[i] = tags[i]; op.mh[i] = b[i].mh;
      }
      if (ops_run(c, &op, 1, 30, err, sizeof err, NULL)) FAIL(c, "round %d: %s", round, err);
      for (int i = 0; i < n; i++) {
        int j = tags[i] - 100;
        size_t sz = group_size(j, round);
        if ((size_t)op.got[i] != sz)
          FAIL(c, "round %d: sizes[%d] (tag %d) = %d, expected %zu", round, i, tags[i], op.got[i], sz);
        long bad = check(b[i].p, sz, seed3(100 + (uint32_t)j, (uint32_t)round, 4));
        if (bad >= 0) FAIL(c, "round %d: buffer %d (tag %d) byte %ld wrong", round, i, tags[i], bad);
      }
    }
    for (int i = 0; i < n; i++)
      if (buf_put(c, &b[i])) return 1;
  }
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (conn_close(c, &k) || child_finalize(c)) return 1;
  if (c->rank == 1) child_detail(c, "n=%d grouped recv, 3 rounds", n);
  return 0;
}

/* ---- ring ----------------------------------------------------------- */
static int child_ring(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  const size_t sz = 4 * MiB;
  int prev = (c->rank + c->n - 1) % c->n;
  Buf sb, rb;
  if (buf_get(c, k.sc, sz, &sb) || buf_get(c, k.rc, sz, &rb)) return 1;
  double dt = 0;
  for (int it = 0; it < 5; it++) {
    fill(sb.p, sz, seed3((uint32_t)c->rank, (uint32_t)it, 5));
    memset(rb.p, 0, sz);
    int got = -1;
    double t0 = now_s();
    if (xfer(c, &sb, sz, &rb, sz, it, &got)) return 1;
    dt += now_s() - t0;
    if ((size_t)got != sz) FAIL(c, "iteration %d: got %d bytes", it, got);
    long bad = check(rb.p, sz, seed3((uint32_t)prev, (uint32_t)it, 5));
    if (bad >= 0) FAIL(c, "iteration %d: byte %ld from rank %d wrong", it, bad, prev);
  }
  if (buf_put(c, &sb) || buf_put(c, &rb)) return 1;
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (conn_close(c, &k) || child_finalize(c)) return 1;
  if (c->rank == 0) child_detail(c, "4 ranks x 5 x 4MiB, %.0f MB/s per rank", 5 * 4.0 * 1.048576 / dt);
  return 0;
}

/* ---- closeinflight --------------------------------------------------- */
static int short_transfer(Child* c, const char* what) {
  Conn k;
  if (ring_setup(c, &k)) return 1;
  int peer = (c->rank + c->n - 1) % c->n;
  Buf sb, rb;
  if (buf_get(c, k.sc, 4096, &sb) || buf_get(c, k.rc, 4096, &rb)) return 1;
  fill(sb.p, 4096, seed3((uint32_t)c->rank, 77, 6));
  int got = -1;
  if (xfer(c, &sb, 4096, &rb, 4096, 0, &got)) return 1;
  if (got != 4096 || check(rb.p, 4096, seed3((uint32_t)peer, 77, 6)) >= 0)
    FAIL(c, "%s: short transfer corrupted (got %d)", what, got);
  if (buf_put(c, &sb) || buf_put(c, &rb)) return 1;
  if (child_barrier(c)) FAIL(c, "barrier failed");
  return conn_close(c, &k);
}

static int child_closeinflight(Child* c, void* arg) {
  (void)arg;
  if (child_open(c)) return 1;
  int fd0 = count_fds();
  Conn k;
  if (ring_setup(c, &k)) return 1;
  /* rank 1 sends to rank 0 (its next); rank 0 receives from rank 1 (its prev). */
  Buf b[8];
  Op ops[8];
  int nops = c->rank == 0 ? 8 : 4;
  char err[200];
  for (int i = 0; i < nops; i++) {
    if (buf_get(c, c->rank == 0 ? k.rc : k.sc, MiB, &b[i])) return 1;
    if (c->rank == 0) op_recv(&ops[i], k.rc, &b[i], MiB, 0);
    else op_send(&ops[i], k.sc, &b[i], MiB, 0);
  }
  /* post everything (bounded), test nothing */
  double end = now_s() + 5;
  for (int i = 0; i < nops; i++) {
    int r;
    while ((r = op_post(c, &ops[i], err, sizeof err)) == 0 && now_s() < end) usleep(100);
    if (r < 0) FAIL(c, "posting op %d: %s", i, err);
    if (r == 0) break; /* back-pressure: leave the rest unposted */
  }
  int posted = 0;
  for (int i = 0; i < nops; i++) posted += ops[i].posted;
  if (child_barrier(c)) FAIL(c, "barrier failed");
  for (int i = 0; i < nops; i++)
    if (buf_put(c, &b[i])) return 1;
  double t0 = now_s();
  if (conn_close(c, &k)) return 1;
  if (c->o->api >= 11) {
    if (child_finalize(c)) return 1;
  }
  double dt = now_s() - t0;
  int fd1 = count_fds();
  if (fd1 > fd0) FAIL(c, "fd leak: %d fds before connection setup, %d after close", fd0, fd1);
  /* the plugin must still work */
  if (c->o->api >= 11) {
    ncclResult_t r = net_init(&c->net, &c->ctx, 0x7300 + (uint64_t)c->rank);
    if (r != ncclSuccess) FAIL(c, "re-init returned %d", r);
  }
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (short_transfer(c, "after close-in-flight") || child_finalize(c)) return 1;
  child_detail(c, "%d/%d posted, closed in %.3f s, fds %d -> %d", posted, nops, dt, fd0, fd1);
  return 0;
}

/* ---- connect: the connections alone ----------------------------------- */
/* Listen, connect, accept and close, with no data: for links where the connection is the thing
   under test and no traffic can flow (the VM's subnet-aware step puts a pair on two wires it does
   not route between). */
static int child_connect(Child* c, void* arg) {
  (void)arg;
  if (child_open(c)) return 1;
  Conn k;
  if (ring_setup(c, &k)) return 1;
  if (!k.sc || !k.rc) FAIL(c, "connect/accept returned success without both comms");
  if (child_barrier(c)) FAIL(c, "barrier failed");
  if (conn_close(c, &k)) return 1;
  if (child_finalize(c)) return 1;
  child_detail(c, "connected, accepted and closed");
  return 0;
}

/* ---- reuse ---------------------------------------------------------- */
static int child_reuse(Child* c, void* arg) {
  (void)arg;
  char err[200];
  uint8_t handle[HSIZE], all[MAX_RANKS][HSIZE];
  void* lc = NULL;
  if (child_open(c)) return 1;
  memset(handle, 0, sizeof handle);
  ncclResult_t r = net_listen(&c->net, c->ctx, c->dev, handle, &lc);
  if (r != ncclSuccess || !lc) FAIL(c, "listen returned %d (comm %p)", r, lc);
  if (child_exchange(c, handle, all)) FAIL(c, "handle exchange failed");
  const size_t szA = 5000, szB = 70000, cap = 128 * KiB;
  if (c->rank == 1) {
    void *s1 = NULL, *s2 = NULL;
    if (connect_accept(c, all[0], &s1, NULL, NULL, err, sizeof err)) FAIL(c, "first connect: %s", err);
    if (connect_accept(c, all[0], &s2, NULL, NULL, err, sizeof err)) FAIL(c, "second connect: %s", err);
    if (s1 == s2) FAIL(c, "two connects returned the same comm %p", s1);
    Buf a, b;
    if (buf_get(c, s1, szA, &a) || buf_get(c, s2, szB, &b)) return 1;
    fill(a.p, szA, seed3(1, 0, 7));
    fill(b.p, szB, seed3(2, 0, 7));
    Op ops[2];
    op_send(&ops[0], s1, &a, szA, 0);
    op_send(&ops[1], s2, &b, szB, 0);
    if (ops_run(c, ops, 2, 30, err, sizeof err, NULL)) FAIL(c, "sends: %s", err);
    if (buf_put(c, &a) || buf_put(c, &b)) return 1;
    if (child_barrier(c)) FAIL(c, "barrier failed");
    r = c->net.closeSend(s1);
    ncclResult_t r2 = c->net.closeSend(s2);
    if (r || r2) FAIL(c, "closeSend returned %d / %d", r, r2);
  } else {
    void *r1 = NULL, *r2 = NULL;
    if (connect_accept(c, NULL, NULL, lc, &r1, err, sizeof err)) FAIL(c, "first accept: %s", err);
    if (connect_accept(c, NULL, NULL, lc, &r2, err, sizeof err)) FAIL(c, "second accept: %s", err);
    if (r1 == r2) FAIL(c, "two accepts returned the same comm %p", r1);
    Buf a, b;
    if (buf_get(c, r1, cap, &a) || buf_get(c, r2, cap, &b)) return 1;
    Op ops[2];
    op_recv(&ops[0], r1, &a, cap, 0);
    op_recv(&ops[1], r2, &b, cap, 0);
    if (ops_run(c, ops, 2, 30, err, sizeof err, NULL)) FAIL(c, "recvs: %s", err);
    /* accept order need not match connect order: identify by size */
    Buf* bufs[2] = {&a, &b};
    int seenA = 0, seenB = 0;
    for (int i = 0; i < 2; i++) {
      size_t got = (size_t)ops[i].got[0];
      uint32_t seed = got == szA ? seed3(1, 0, 7) : seed3(2, 0, 7);
      if (got != szA && got != szB) FAIL(c, "connection %d: got %zu bytes", i, got);
      if (check(bufs[i]->p, got, seed) >= 0) FAIL(c, "connection %d: content wrong", i);
      seenA += got == szA;
      seenB += got == szB;
    }
    if (seenA != 1 || seenB != 1) FAIL(c, "both connections delivered the same message");
    if (buf_put(c, &a) || buf_put(c, &b)) return 1;
    if (child_barrier(c)) FAIL(c, "barrier failed");
    r = c->net.closeRecv(r1);
    ncclResult_t rr = c->net.closeRecv(r2);
    if (r || rr) FAIL(c, "closeRecv returned %d / %d", r, rr);
    child_detail(c, "one listen comm accepted 2 connections");
  }
  r = c->net.closeListen(lc);
  if (r != ncclSuccess) FAIL(c, "closeListen returned %d", r);
  return child_finalize(c);
}
