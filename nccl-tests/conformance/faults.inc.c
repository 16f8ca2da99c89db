/* Part of nccl-tests/conformance.c (one translation unit: every helper stays static, and the
 * build is one cc command). The fault and edge cases: mismatch, kill, reload, optional, badargs, badrkey. */
/* ---- mismatch ------------------------------------------------------- */
static int child_mismatch(Child* c, void* arg) {
  (void)arg;
  Conn k;
  char err[200];
  if (child_open(c) || ring_setup(c, &k)) return 1;
  if (c->rank == 0) { /* receiver of rank 1 */
    Buf rb;
    if (buf_get(c, k.rc, 4 * KiB, &rb)) return 1;
    Op op;
    op_recv(&op, k.rc, &rb, 4 * KiB, 0);
    double t0 = now_s();
    int r = ops_run(c, &op, 1, 10, err, sizeof err, NULL);
    double dt = now_s() - t0;
    if (r == 0) FAIL(c, "4KiB recv of a 64KiB send completed successfully (size %d)", op.got[0]);
    if (r < 0) FAIL(c, "receiver got no error: %s", err);
    if (r != ncclInvalidUsage) FAIL(c, "receiver got %d (%s), expected ncclInvalidUsage (5)", r, err);
    buf_put(c, &rb); /* error code of deregMr after a failed request is not judged */
    conn_close(c, &k);
    child_finalize(c);
    child_detail(c, "recv -> %d after %.3f s", r, dt);
  } else { /* sender to rank 0 */
    Buf sb;
    if (buf_get(c, k.sc, 64 * KiB, &sb)) return 1;
    fill(sb.p, 64 * KiB, 9);
    Op op;
    op_send(&op, k.sc, &sb, 64 * KiB, 0);
    double t0 = now_s();
    int r = ops_run(c, &op, 1, c->o->rivet_timeout + 10, err, sizeof err, NULL);
    double dt = now_s() - t0;
    if (r < 0) FAIL(c, "sender's request did not terminate: %s", err);
    buf_put(c, &sb);
    conn_close(c, &k);
    child_finalize(c);
    child_detail(c, "send -> %d after %.3f s", r, dt);
  }
  return 0;
}

/* ---- kill ----------------------------------------------------------- */
/* Rank 0 and rank 1 are ring-connected; the data stream runs from `sender`
 * to the other rank, and rank 1 is always the victim:
 *   kill_sender=1: rank 1 sends, rank 0 receives, rank 1 is killed;
 *   kill_sender=0: rank 0 sends, rank 1 receives, rank 1 is killed. */
typedef struct { int kill_sender; } KillArg;
#define KILL_MSG (16 * MiB)
#define VICTIM 1

/* Sender: stream 16 MiB messages until an error (survivor) or SIGKILL (victim). */
static int kill_sender_side(Child* c, Conn* k, int survivor) {
  char err[200];
  Buf sb;
  if (buf_get(c, k->sc, KILL_MSG, &sb)) return 1;
  double t_notice = 0;
  for (int msg = 0; msg < 100000; msg++) {
    fill(sb.p, 4096, seed3((uint32_t)msg, 0, 8)); /* first page identifies the message */
    Op op;
    op_send(&op, k->sc, &sb, KILL_MSG, 0);
    for (;;) {
      int r = ops_run(c, &op, 1, 0.05, err, sizeof err, NULL);
      child_check_kill_notice(c);
      if (c->peer_killed && t_notice == 0) t_notice = now_s();
      if (r == 0) break;
      if (r < 0) {
        if (t_notice && now_s() > t_notice + c->o->rivet_timeout + 5)
          FAIL(c, "sender: no error %d s after the receiver was killed (msg %d)",
               c->o->rivet_timeout + 5, msg);
        continue;
      }
      if (!survivor) FAIL(c, "sender got error %d before anything was killed: %s", r, err);
      double until = now_s() + 2; /* the kill notice may trail the socket error */
      while (!c->peer_killed && now_s() < until) { usleep(1000); child_check_kill_notice(c); }
      if (!c->peer_killed) FAIL(c, "send error %d before the receiver was killed: %s", r, err);
      if (t_notice == 0) t_notice = now_s();
      if (r != ncclRemoteError && r != ncclSystemError)
        FAIL(c, "sender got %d after the receiver died, expected 6 (or 2)", r);
      double t = now_s() - t_notice;
      buf_put(c, &sb);
      conn_close(c, k);
      child_finalize(c);
      child_detail(c, "send -> %d (%s) %.2f s after kill, %d msgs sent", r,
                   r == ncclRemoteError ? "RemoteError" : "SystemError", t, msg);
      return 0;
    }
  }
  FAIL(c, "sender: stream ended without a kill");
}

static int kill_receiver_side(Child* c, Conn* k, int survivor) {
  char err[200];
  Buf rb;
  if (buf_get(c, k->rc, KILL_MSG, &rb)) return 1;
  int victim = VICTIM;
  double t_kill = 0;
  for (int msg = 0; msg < 100000; msg++) {
    Op op;
    op_recv(&op, k->rc, &rb, KILL_MSG, 0);
    double t_msg = now_s();
    int r;
    for (;;) {
      r = ops_run(c, &op, 1, 0.05, err, sizeof err, NULL);
      if (r >= 0) break;
      if (t_kill && now_s() > t_kill + c->o->rivet_timeout + 5)
        FAIL(c, "receiver: no error %d s after the sender was killed (%d msgs received)",
             c->o->rivet_timeout + 5, msg);
      if (!t_kill && now_s() > t_msg + 30) FAIL(c, "message %d not received within 30 s", msg);
    }
    if (r > 0) {
      if (!t_kill) FAIL(c, "receiver got error %d before the sender was killed: %s", r, err);
      if (r != ncclRemoteError && r != ncclSystemError)
        FAIL(c, "receiver got %d after the sender died, expected 6 (or 2)", r);
      double t = now_s() - t_kill;
      buf_put(c, &rb);
      conn_close(c, k);
      child_finalize(c);
      child_detail(c, "recv -> %d (%s) %.2f s after kill, %d msgs ok", r,
                   r == ncclRemoteError ? "RemoteError" : "SystemError", t, msg);
      return 0;
    }
    if ((size_t)op.got[0] != KILL_MSG) FAIL(c, "message %d: got %d bytes", msg, op.got[0]);
    if (check(rb.p, 4096, seed3((uint32_t)msg, 0, 8)) >= 0) FAIL(c, "message %d: content wrong", msg);
    if (msg == 0 && !survivor) {
      /* post the next receive so we die mid-transfer, then ask to be killed */
      Op nx;
      op_recv(&nx, k->rc, &rb, KILL_MSG, 0);
      ops_run(c, &nx, 1, 0.01, err, sizeof err, NULL);
      child_msg(c, 'K', &victim, sizeof victim);
      for (;;) ops_run(c, &nx, 1, 0.05, err, sizeof err, NULL); /* until SIGKILL (or alarm) */
    }
    if (msg == 0) {
      child_msg(c, 'K', &victim, sizeof victim);
      t_kill = now_s();
    }
  }
  FAIL(c, "receiver: stream ended without an error");
}

static int child_kill(Child* c, void* arg) {
  const KillArg* ka = arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  int sender = ka->kill_sender ? 1 : 0;
  int survivor = c->rank != VICTIM;
  return c->rank == sender ? kill_sender_side(c, &k, survivor) : kill_receiver_side(c, &k, survivor);
}

/* ---- reload --------------------------------------------------------- */
static int child_reload(Child* c, void* arg) {
  (void)arg;
  char err[200];
  int th0 = count_threads(), th1 = -1, thN = -1;
  const size_t sz = MiB;
  for (int it = 0; it < 20; it++) {
    if (child_open(c)) return 1;
    uint8_t handle[HSIZE];
    memset(handle, 0, sizeof handle);
    void *lc = NULL;
    ncclResult_t r = net_listen(&c->net, c->ctx, c->dev, handle, &lc);
    if (r != ncclSuccess || !lc) FAIL(c, "iteration %d: listen returned %d", it, r);
    Conn k = {lc, NULL, NULL};
    if (connect_accept(c, handle, &k.sc, lc, &k.rc, err, sizeof err))
      FAIL(c, "iteration %d: %s", it, err);
    Buf sb, rb;
    if (buf_get(c, k.sc, sz, &sb) || buf_get(c, k.rc, sz, &rb)) return 1;
    fill(sb.p, sz, seed3((uint32_t)it, 0, 10));
    int got = -1;
    if (xfer(c, &sb, sz, &rb, sz, 0, &got)) return 1;
    if ((size_t)got != sz || check(rb.p, sz, seed3((uint32_t)it, 0, 10)) >= 0)
      FAIL(c, "iteration %d: loopback data wrong (got %d)", it, got);
    if (buf_put(c, &sb) || buf_put(c, &rb) || conn_close(c, &k) || child_finalize(c)) return 1;
    net_unload(&c->net);
    if (it == 0 || it == 19) {
      usleep(100000); /* let exiting threads disappear */
      if (it == 0) th1 = count_threads(); else thN = count_threads();
    }
  }
  if (thN > th1) FAIL(c, "threads grow with reloads: start %d, after 1st %d, after 20th %d", th0, th1, thN);
  child_detail(c, "20 x dlopen/init/xfer/dlclose, threads %d -> %d -> %d", th0, th1, thN);
  return 0;
}

/* ---- optional ------------------------------------------------------- */
static int child_optional(Child* c, void* arg) {
  (void)arg;
  Conn k;
  char err[200];
  if (child_open(c) || ring_setup(c, &k)) return 1;
  const size_t sz = 4 * KiB;
  if (c->rank == 1) {
    Buf sb;
    if (buf_get(c, k.sc, sz, &sb)) return 1;
    fill(sb.p, sz, 11);
    if (xfer(c, &sb, sz, NULL, 0, 0, NULL) || buf_put(c, &sb)) return 1;
  } else {
    Buf rb;
    if (buf_get(c, k.rc, sz, &rb)) return 1;
    Op op;
    op_recv(&op, k.rc, &rb, sz, 0);
    op.optional = 1;
    if (ops_run(c, &op, 1, 30, err, sizeof err, NULL)) FAIL(c, "%s", err);
    if ((size_t)op.got[0] != sz || check(rb.p, sz, 11) >= 0) FAIL(c, "data wrong (got %d)", op.got[0]);
    if (buf_put(c, &rb)) return 1;
    child_detail(c, "optional recv completed, %d retries", op.retries);
  }
  if (child_barrier(c)) FAIL(c, "barrier failed");
  return conn_close(c, &k) || child_finalize(c);
}

/* ---- badargs -------------------------------------------------------- */
static int child_badargs(Child* c, void* arg) {
  (void)arg;
  char err[200];
  if (child_open(c)) return 1;
  int ndev = 0;
  if (c->net.devices(&ndev) != ncclSuccess || ndev <= 0) FAIL(c, "devices failed");
  Props p;
  ncclResult_t r = net_props(&c->net, ndev + 5, &p);
  if (r == ncclSuccess) FAIL(c, "getProperties(%d) returned success", ndev + 5);
  ncclResult_t rneg = net_props(&c->net, -1, &p);
  if (rneg == ncclSuccess) FAIL(c, "getProperties(-1) returned success");
  uint8_t handle[HSIZE];
  void* lc = NULL;
  ncclResult_t rl = net_listen(&c->net, c->ctx, -1, handle, &lc);
  if (rl == ncclSuccess) FAIL(c, "listen(dev -1) returned success");
  int done = 0;
  ncclResult_t rt = c->net.test(NULL, &done, NULL);
  if (rt == ncclSuccess) FAIL(c, "test(NULL) returned success");
  /* a real connection for deregMr(comm, NULL) */
  memset(handle, 0, sizeof handle);
  r = net_listen(&c->net, c->ctx, c->dev, handle, &lc);
  if (r != ncclSuccess || !lc) FAIL(c, "listen returned %d", r);
  Conn k = {lc, NULL, NULL};
  if (connect_accept(c, handle, &k.sc, lc, &k.rc, err, sizeof err)) FAIL(c, "%s", err);
  ncclResult_t rd1 = c->net.deregMr(k.sc, NULL);
  ncclResult_t rd2 = c->net.deregMr(k.rc, NULL);
  ncclResult_t rcs = c->net.closeSend(NULL);
  ncclResult_t rcr = c->net.closeRecv(NULL);
  ncclResult_t rcl = c->net.closeListen(NULL);
  if (conn_close(c, &k) || child_finalize(c)) return 1;
  child_detail(c, "props(-1)=%d listen(-1)=%d test(NULL)=%d deregMr(NULL)=%d/%d close*(NULL)=%d/%d/%d",
               rneg, rl, rt, rd1, rd2, rcs, rcr, rcl);
  return 0;
}

/* ---- badrkey (RDMA verbs only; not in "all") -------------------------- */
/* Rank 1 posts a 1 MiB receive and deregisters its buffer right away, so the rkey in the
 * clear-to-send the plugin already wrote is stale; rank 0's RDMA WRITE must then fail with
 * ncclRemoteError and a WARN naming REM_ACCESS_ERR and the rkey.  Over TCP (no rkeys) the
 * transfer simply succeeds, which this case reports as a failure. */
#define BADRKEY_SIZE   MiB
#define BADRKEY_TAG    1
#define BADRKEY_SEND_S 20.0
#define BADRKEY_RECV_S 15.0

static int badrkey_receiver(Child* c, Conn* k) {
  char err[200];
  Buf rb;
  if (buf_get(c, k->rc, BADRKEY_SIZE, &rb)) return 1;
  memset(rb.p, 0x3C, rb.len);
  Op op;
  op_recv(&op, k->rc, &rb, BADRKEY_SIZE, BADRKEY_TAG);
  double end = now_s() + 10;
  int pr;
  while ((pr = op_post(c, &op, err, sizeof err)) == 0 && now_s() < end) usleep(100);
  if (pr < 0) FAIL(c, "%s", err);
  if (pr == 0) FAIL(c, "irecv returned a NULL request for 10 s (%d retries)", op.retries);
  ncclResult_t r = c->net.deregMr(k->rc, rb.mh); /* the clear-to-send's rkey goes stale */
  if (r != ncclSuccess) FAIL(c, "deregMr of the posted receive's handle returned %d", r);
  rb.mh = NULL;
  if (child_barrier(c)) FAIL(c, "barrier (go-ahead to the sender) failed");
  /* Either outcome is fine here; the receiver must just neither hang nor crash. */
  double t0 = now_s();
  int t = 0;
  while ((t = op_test(c, &op, err, sizeof err)) == 0 && now_s() < t0 + BADRKEY_RECV_S) usleep(100);
  double dt = now_s() - t0;
  if (child_barrier(c)) FAIL(c, "barrier (sender done) failed");
  conn_close(c, k); /* close and finalize results after a failed request are not judged */
  child_finalize(c);
  free(rb.p);
  if (t < 0) child_detail(c, "recv -> %d after %.2f s", (int)op.err, dt);
  else if (t > 0) child_detail(c, "recv completed without error (%d bytes) after %.2f s", op.got[0], dt);
  else child_detail(c, "recv: no error within %.0f s", BADRKEY_RECV_S);
  return 0;
}

static int badrkey_sender(Child* c, Conn* k) {
  char err[200], warn[WARN_LEN];
  char why[WARN_LEN + 512]; /* whole on stderr; the parent's detail keeps DETAIL_LEN of it */
  Props p;
  const char* dname = net_props(&c->net, c->dev, &p) == ncclSuccess && p.name ? p.name : "?";
  Buf sb;
  if (buf_get(c, k->sc, BADRKEY_SIZE, &sb)) return 1;
  fill(sb.p, BADRKEY_SIZE, seed3(1, 0, 12));
  if (child_barrier(c)) FAIL(c, "barrier (go-ahead from the receiver) failed");
  Op op;
  op_send(&op, k->sc, &sb, BADRKEY_SIZE, BADRKEY_TAG);
  double t0 = now_s(), end = t0 + BADRKEY_SEND_S;
  int pr, t = 0, r = 0;
  const char* call = "isend";
  while ((pr = op_post(c, &op, err, sizeof err)) == 0 && now_s() < end) usleep(100);
  if (pr < 0) {
    r = (int)op.err;
  } else if (pr > 0) {
    call = "test";
    while ((t = op_test(c, &op, err, sizeof err)) == 0 && now_s() < end) usleep(100);
    if (t < 0) r = (int)op.err;
  }
  double dt = now_s() - t0;
  why[0] = 0;
  if (pr == 0)
    snprintf(why, sizeof why, "isend returned a NULL request for %.0f s (%d retries)", BADRKEY_SEND_S,
             op.retries);
  else if (t > 0)
    snprintf(why, sizeof why,
             "the send to a stale rkey completed without error after %.2f s (dev %d '%s'): badrkey "
             "needs the RDMA verbs transport; over TCP there are no rkeys", dt, c->dev, dname);
  else if (r == 0)
    snprintf(why, sizeof why, "send still pending after %.0f s, expected ncclRemoteError (6)",
             BADRKEY_SEND_S);
  else if (r != ncclRemoteError) {
    warn_last(warn, sizeof warn);
    snprintf(why, sizeof why, "%s -> %d after %.2f s, expected ncclRemoteError (6); last WARN: %s",
             call, r, dt, warn[0] ? warn : "(none)");
  } else if (warn_find("REM_ACCESS_ERR", "rkey", warn, sizeof warn) != 0) {
    warn_last(warn, sizeof warn);
    snprintf(why, sizeof why, "%s -> 6 but no WARN names both REM_ACCESS_ERR and rkey; last: %s",
             call, warn[0] ? warn : "(none)");
  }
  if (child_barrier(c)) FAIL(c, "barrier (sender done) failed%s%s", why[0] ? "; " : "", why);
  buf_put(c, &sb); /* deregMr, close and finalize results after a failed request are not judged */
  conn_close(c, k);
  child_finalize(c);
  if (why[0]) FAIL(c, "%s", why);
  child_detail(c, "%s -> 6 after %.2f s, WARN names REM_ACCESS_ERR", call, dt);
  return 0;
}

static int child_badrkey(Child* c, void* arg) {
  (void)arg;
  Conn k;
  if (child_open(c) || ring_setup(c, &k)) return 1;
  /* ring of 2: rank 0's send comm reaches rank 1's recv comm */
  return c->rank == 0 ? badrkey_sender(c, &k) : badrkey_receiver(c, &k);
}
