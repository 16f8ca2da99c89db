/* Part of nccl-tests/conformance.c (one translation unit: every helper stays static, and the
 * build is one cc command). The version adapter: any ncclNet_vN table (v6 ... v12) behind one set of calls. */
/* ===================================================================== */
/* Version adapter                                                       */
/* ===================================================================== */

/* Properties normalised over all versions; fields absent in a version keep
 * the value NCCL's compat shims would assign. */
typedef struct {
  const char* name;
  const char* pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
  int vndevs, vdevs[8];
  size_t maxP2pBytes, maxCollBytes;
  int maxMultiRequestSize;
  int railId, planeId;
} Props;

typedef struct {
  int api;
  void* dl;
  const void* tab;
  const char* name;
  ncclNetCommConfig_v10_t cfg; /* v10 connect / v11+ init; must outlive the calls */
  /* members with one signature in every version */
  ncclResult_t (*devices)(int*);
  ncclResult_t (*deregMr)(void*, void*);
  ncclResult_t (*iflush)(void*, int, void**, int*, void**, void**);
  ncclResult_t (*test)(void*, int*, int*);
  ncclResult_t (*closeSend)(void*);
  ncclResult_t (*closeRecv)(void*);
  ncclResult_t (*closeListen)(void*);
} Net;

#define T(v) ((const ncclNet_v##v##_t*)net->tab)
#define FILL_COMMON(v)                          \
  do {                                          \
    const ncclNet_v##v##_t* t = net->tab;       \
    net->name = t->name;                        \
    net->devices = t->devices;                  \
    net->deregMr = t->deregMr;                  \
    net->iflush = t->iflush;                    \
    net->test = t->test;                        \
    net->closeSend = t->closeSend;              \
    net->closeRecv = t->closeRecv;              \
    net->closeListen = t->closeListen;          \
  } while (0)

static int net_load(Net* net, const char* lib, int api, char* err, size_t el) {
  memset(net, 0, sizeof *net);
  net->api = api;
  net->cfg.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
  /* NCCL 2.30's NCCL_NET_PLUGIN=STATIC_PLUGIN: look in the program's global scope (a plugin
   * linked into the program or LD_PRELOADed), as dlopen(NULL) does. */
  net->dl = dlopen(strcmp(lib, "STATIC_PLUGIN") == 0 ? NULL : lib, RTLD_NOW | RTLD_LOCAL);
  if (!net->dl) {
    snprintf(err, el, "dlopen(%s): %s", lib, dlerror());
    return -1;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", api);
  net->tab = dlsym(net->dl, sym);
  if (!net->tab) {
    snprintf(err, el, "dlsym(%s): %s", sym, dlerror());
    dlclose(net->dl);
    net->dl = NULL;
    return -1;
  }
  switch (api) {
    case 6: FILL_COMMON(6); break;
    case 7: FILL_COMMON(7); break;
    case 8: FILL_COMMON(8); break;
    case 9: FILL_COMMON(9); break;
    case 10: FILL_COMMON(10); break;
    case 11: FILL_COMMON(11); break;
    case 12: FILL_COMMON(12); break;
    default: snprintf(err, el, "bad api %d", api); return -1;
  }
  return 0;
}

static void net_unload(Net* net) {
  if (net->dl) dlclose(net->dl);
  memset(net, 0, sizeof *net);
}

/* NCCL's profiler callback (v10+), counting: every request this driver posts carries a profiler
 * handle (one for sends, one for receives), and the plugin may report network events under it.
 * A start must name one of the two handles, net_ib's plugin id (NCCL_PROFILER_NET_TYPE_IB | 1)
 * and a queue-pair descriptor; a stop must return a handle a start gave, once. */
typedef struct {
  uint8_t type;
  struct { int device; uint64_t wr_id; int opcode; int qpNum; size_t length; } qp;
} ProfIbDescr;
#define PROF_MAX 65536
static char prof_send_ph, prof_recv_ph;
static long prof_starts, prof_stops, prof_bad;
static size_t prof_send_bytes;
static unsigned char prof_open[PROF_MAX + 1];
static char prof_why[160];
static ncclResult_t prof_cb(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  if (type == 0) {
    ProfIbDescr* d = (ProfIbDescr*)extData;
    if ((pHandle != &prof_send_ph && pHandle != &prof_recv_ph) || pluginId != 0x10001 || !d ||
        d->type != 1 || d->qp.qpNum <= 0 || d->qp.opcode < 0 || d->qp.opcode > 1 || d->qp.device < 0) {
      if (!prof_bad++)
        snprintf(prof_why, sizeof prof_why, "start with pHandle %p, plugin id %#llx, descriptor type %d qp %d opcode %d",
                 pHandle, (unsigned long long)pluginId, d ? d->type : -1, d ? d->qp.qpNum : -1, d ? d->qp.opcode : -1);
      *eHandle = NULL;
      return ncclSuccess;
    }
    if (pHandle == &prof_send_ph) prof_send_bytes += d->qp.length;
    long id = ++prof_starts;
    if (id <= PROF_MAX) prof_open[id] = 1;
    *eHandle = (void*)(intptr_t)id;
  } else if (type == 1) {
    long id = (long)(intptr_t)*eHandle;
    if (id < 1 || id > prof_starts || (id <= PROF_MAX && !prof_open[id])) {
      if (!prof_bad++) snprintf(prof_why, sizeof prof_why, "stop of handle %ld, which no start gave or which was stopped already", id);
      return ncclSuccess;
    }
    if (id <= PROF_MAX) prof_open[id] = 0;
    prof_stops++;
  } else if (!prof_bad++) {
    snprintf(prof_why, sizeof prof_why, "event type %d (rivet reports only start and stop)", type);
  }
  return ncclSuccess;
}

static ncclResult_t net_init(Net* net, void** ctx, uint64_t commId) {
  *ctx = NULL;
  switch (net->api) {
    case 6: return T(6)->init(logger);
    case 7: return T(7)->init(logger);
    case 8: return T(8)->init(logger);
    case 9: return T(9)->init(logger);
    case 10: return T(10)->init(logger, prof_cb);
    case 11: return T(11)->init(ctx, commId, &net->cfg, logger, prof_cb);
    case 12: return T(12)->init(ctx, commId, &net->cfg, logger, prof_cb);
  }
  return ncclInternalError;
}

/* makeVDevice of v9+ (a NULL member, and any version before v9: ncclInvalidUsage, as NCCL treats
 * no fusion). v9-v11 carry at most 4 devices, v12 8 (the caller checks). */
static ncclResult_t net_make_vdevice(Net* net, const int* devs, int n, int* d) {
  ncclNetVDeviceProps_v9_t p9;
  ncclNetVDeviceProps_v12_t p12;
  memset(&p9, 0, sizeof p9);
  memset(&p12, 0, sizeof p12);
  p9.ndevs = p12.ndevs = n;
  for (int i = 0; i < n && i < 8; i++) {
    if (i < 4) p9.devs[i] = devs[i];
    p12.devs[i] = devs[i];
  }
  switch (net->api) {
    case 9: return T(9)->makeVDevice ? T(9)->makeVDevice(d, &p9) : ncclInvalidUsage;
    case 10: return T(10)->makeVDevice ? T(10)->makeVDevice(d, (ncclNetVDeviceProps_v10_t*)&p9) : ncclInvalidUsage;
    case 11: return T(11)->makeVDevice ? T(11)->makeVDevice(d, (ncclNetVDeviceProps_v11_t*)&p9) : ncclInvalidUsage;
    case 12: return T(12)->makeVDevice ? T(12)->makeVDevice(d, &p12) : ncclInvalidUsage;
  }
  return ncclInvalidUsage;
}

/* v6..v10 have no finalize: success. */
static ncclResult_t net_finalize(Net* net, void* ctx) {
  if (net->api == 11) return T(11)->finalize ? T(11)->finalize(ctx) : ncclSuccess;
  if (net->api == 12) return T(12)->finalize ? T(12)->finalize(ctx) : ncclSuccess;
  return ncclSuccess;
}

#define COPY_BASE(q)                                                     \
  do {                                                                   \
    p->name = (q).name; p->pciPath = (q).pciPath; p->guid = (q).guid;    \
    p->ptrSupport = (q).ptrSupport; p->speed = (q).speed;                \
    p->port = (q).port; p->latency = (q).latency;                        \
    p->maxComms = (q).maxComms; p->maxRecvs = (q).maxRecvs;              \
  } while (0)
#define COPY_V9(q)                                                       \
  do {                                                                   \
    COPY_BASE(q);                                                        \
    p->regIsGlobal = (q).regIsGlobal; p->forceFlush = (q).forceFlush;    \
    p->netDeviceType = (q).netDeviceType;                                \
    p->netDeviceVersion = (q).netDeviceVersion;                          \
    p->vndevs = (q).vProps.ndevs;                                        \
    for (int i = 0; i < (int)(sizeof((q).vProps.devs) / sizeof(int)); i++) \
      p->vdevs[i] = (q).vProps.devs[i];                                  \
    p->maxP2pBytes = (q).maxP2pBytes; p->maxCollBytes = (q).maxCollBytes;\
  } while (0)

static ncclResult_t net_props(Net* net, int dev, Props* p) {
  ncclResult_t rc = ncclInternalError;
  memset(p, 0, sizeof *p);
  /* defaults as NCCL's shims would fill them for older versions */
  p->vndevs = 1;
  p->vdevs[0] = dev;
  p->maxP2pBytes = MAX_NET_SIZE;
  p->maxCollBytes = MAX_COLLNET_SIZE;
  p->maxMultiRequestSize = 1;
  p->railId = p->planeId = NCCL_NET_ID_UNDEF;
  switch (net->api) {
    case 6: { ncclNetProperties_v6_t q; memset(&q, 0, sizeof q);
      rc = T(6)->getProperties(dev, &q); COPY_BASE(q); break; }
    case 7: { ncclNetProperties_v7_t q; memset(&q, 0, sizeof q);
      rc = T(7)->getProperties(dev, &q); COPY_BASE(q);
      p->netDeviceType = q.netDeviceType; p->netDeviceVersion = q.netDeviceVersion; break; }
    case 8: { ncclNetProperties_v8_t q; memset(&q, 0, sizeof q);
      rc = T(8)->getProperties(dev, &q); COPY_BASE(q); p->regIsGlobal = q.regIsGlobal;
      p->netDeviceType = q.netDeviceType; p->netDeviceVersion = q.netDeviceVersion; break; }
    case 9: { ncclNetProperties_v9_t q; memset(&q, 0, sizeof q);
      rc = T(9)->getProperties(dev, &q); COPY_V9(q); break; }
    case 10: { ncclNetProperties_v10_t q; memset(&q, 0, sizeof q);
      rc = T(10)->getProperties(dev, &q); COPY_V9(q); break; }
    case 11: { ncclNetProperties_v11_t q; memset(&q, 0, sizeof q);
      rc = T(11)->getProperties(dev, &q); COPY_V9(q);
      p->maxMultiRequestSize = q.maxMultiRequestSize; break; }
    case 12: { ncclNetProperties_v12_t q; memset(&q, 0, sizeof q);
      rc = T(12)->getProperties(dev, &q); COPY_V9(q);
      p->maxMultiRequestSize = q.maxMultiRequestSize;
      p->railId = q.railId; p->planeId = q.planeId; break; }
  }
  return rc;
}

static ncclResult_t net_listen(Net* net, void* ctx, int dev, void* handle, void** lc) {
  switch (net->api) {
    case 6: return T(6)->listen(dev, handle, lc);
    case 7: return T(7)->listen(dev, handle, lc);
    case 8: return T(8)->listen(dev, handle, lc);
    case 9: return T(9)->listen(dev, handle, lc);
    case 10: return T(10)->listen(dev, handle, lc);
    case 11: return T(11)->listen(ctx, dev, handle, lc);
    case 12: return T(12)->listen(ctx, dev, handle, lc);
  }
  return ncclInternalError;
}

static ncclResult_t net_connect(Net* net, void* ctx, int dev, void* handle, void** sc,
                                ncclNetDeviceHandle_v7_t** dc) {
  switch (net->api) {
    case 6: return T(6)->connect(dev, handle, sc);
    case 7: return T(7)->connect(dev, handle, sc, dc);
    case 8: return T(8)->connect(dev, handle, sc, dc);
    case 9: return T(9)->connect(dev, handle, sc, dc);
    case 10: return T(10)->connect(dev, &net->cfg, handle, sc, dc);
    case 11: return T(11)->connect(ctx, dev, handle, sc, dc);
    case 12: return T(12)->connect(ctx, dev, handle, sc, dc);
  }
  return ncclInternalError;
}

static ncclResult_t net_accept(Net* net, void* lc, void** rc, ncclNetDeviceHandle_v7_t** dc) {
  switch (net->api) {
    case 6: return T(6)->accept(lc, rc);
    case 7: return T(7)->accept(lc, rc, dc);
    case 8: return T(8)->accept(lc, rc, dc);
    case 9: return T(9)->accept(lc, rc, dc);
    case 10: return T(10)->accept(lc, rc, dc);
    case 11: return T(11)->accept(lc, rc, dc);
    case 12: return T(12)->accept(lc, rc, dc);
  }
  return ncclInternalError;
}

static ncclResult_t net_regmr(Net* net, void* comm, void* data, size_t size, int type, void** mh) {
  switch (net->api) {
    case 6: return T(6)->regMr(comm, data, (int)size, type, mh);
    case 7: return T(7)->regMr(comm, data, (int)size, type, mh);
    case 8: return T(8)->regMr(comm, data, size, type, mh);
    case 9: return T(9)->regMr(comm, data, size, type, mh);
    case 10: return T(10)->regMr(comm, data, size, type, mh);
    case 11: return T(11)->regMr(comm, data, size, type, mh);
    case 12: return T(12)->regMr(comm, data, size, type, mh);
  }
  return ncclInternalError;
}

static ncclResult_t net_isend(Net* net, void* sc, void* data, size_t size, int tag, void* mh,
                              void** req) {
  switch (net->api) {
    case 6: return T(6)->isend(sc, data, (int)size, tag, mh, req);
    case 7: return T(7)->isend(sc, data, (int)size, tag, mh, req);
    case 8: return T(8)->isend(sc, data, (int)size, tag, mh, req);
    case 9: return T(9)->isend(sc, data, size, tag, mh, req);
    case 10: return T(10)->isend(sc, data, size, tag, mh, &prof_send_ph, req);
    case 11: return T(11)->isend(sc, data, size, tag, mh, &prof_send_ph, req);
    case 12: return T(12)->isend(sc, data, size, tag, mh, &prof_send_ph, req);
  }
  return ncclInternalError;
}

/* isizes: caller-owned int array used for v6..v8 (int sizes). */
static ncclResult_t net_irecv(Net* net, void* rc, int n, void** data, size_t* sizes, int* isizes,
                              int* tags, void** mhs, void** req) {
  if (net->api <= 8)
    for (int i = 0; i < n; i++) isizes[i] = (int)sizes[i];
  void* ph[8];
  for (int i = 0; i < n && i < 8; i++) ph[i] = &prof_recv_ph;
  switch (net->api) {
    case 6: return T(6)->irecv(rc, n, data, isizes, tags, mhs, req);
    case 7: return T(7)->irecv(rc, n, data, isizes, tags, mhs, req);
    case 8: return T(8)->irecv(rc, n, data, isizes, tags, mhs, req);
    case 9: return T(9)->irecv(rc, n, data, sizes, tags, mhs, req);
    case 10: return T(10)->irecv(rc, n, data, sizes, tags, mhs, ph, req);
    case 11: return T(11)->irecv(rc, n, data, sizes, tags, mhs, ph, req);
    case 12: return T(12)->irecv(rc, n, data, sizes, tags, mhs, ph, req);
  }
  return ncclInternalError;
}
