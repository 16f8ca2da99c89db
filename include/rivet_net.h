/*
 * rivet_net.h - C declarations for the rivet NCCL network plugin.
 *
 * Declares the NCCL net-plugin ABI (ncclNet v6 ... v12) as exported by
 * libnccl-net-rivet.so.  The names follow NCCL's own so that users and
 * tools recognise them; the layouts are those of NCCL 2.18 ... 2.30 on
 * LP64 (x86_64 / aarch64).  The plugin exports one const table per
 * version: ncclNetPlugin_v6 ... ncclNetPlugin_v12.
 *
 * Self-contained: needs only <stdint.h> and <stddef.h>.  C99 or later.
 */
#ifndef RIVET_NET_H
#define RIVET_NET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Result codes (nccl.h).  Guarded so this header can follow nccl.h.  */
/* ------------------------------------------------------------------ */
#ifndef NCCL_H_
typedef enum {
  ncclSuccess            = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError        = 2,
  ncclInternalError      = 3,
  ncclInvalidArgument    = 4,
  ncclInvalidUsage       = 5,
  ncclRemoteError        = 6,
  ncclInProgress         = 7,
  ncclTimeout            = 8,
  ncclNumResults         = 9
} ncclResult_t;
#endif

/* ------------------------------------------------------------------ */
/* Logging and profiling callbacks (nccl_common.h)                     */
/* ------------------------------------------------------------------ */
typedef enum {
  NCCL_LOG_NONE    = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN    = 2,
  NCCL_LOG_INFO    = 3,
  NCCL_LOG_ABORT   = 4,
  NCCL_LOG_TRACE   = 5
} ncclDebugLogLevel;

typedef enum {
  NCCL_INIT       = 0x1,
  NCCL_COLL       = 0x2,
  NCCL_P2P        = 0x4,
  NCCL_SHM        = 0x8,
  NCCL_NET        = 0x10,
  NCCL_GRAPH      = 0x20,
  NCCL_TUNING     = 0x40,
  NCCL_ENV        = 0x80,
  NCCL_ALLOC      = 0x100,
  NCCL_CALL       = 0x200,
  NCCL_PROXY      = 0x400,
  NCCL_NVLS       = 0x800,
  NCCL_BOOTSTRAP  = 0x1000,
  NCCL_REG        = 0x2000,
  NCCL_PROFILE    = 0x4000,
  NCCL_RAS        = 0x8000,
  NCCL_DESTROY    = 0x10000,
  NCCL_ALLOC_HOST = 0x20000,
  NCCL_ALL        = ~0
} ncclDebugLogSubSys;

/* C-variadic logger supplied by NCCL to init(). */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char* file, int line, const char* fmt, ...);

enum {
  ncclProfilerNetEventStart = 0,
  ncclProfilerNetEventStop,
  ncclProfilerNetEventUpdate,
  ncclProfilerNetEventUpdateAndStop
};

/* Profiler callback (v10+). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

/* ------------------------------------------------------------------ */
/* Constants (nccl_net.h)                                              */
/* ------------------------------------------------------------------ */
#define NCCL_NET_HANDLE_MAXSIZE           128
#define NCCL_MAX_NET_SIZE_BYTES           (1*1024*1024*1024*1024L) /* 1 TiB */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MULTI_REQUEST            0x2
#define MAX_NET_SIZE                      (1024*1024*1024L)        /* 1 GiB */
#define MAX_COLLNET_SIZE                  (512*1024*1024L)

#define NCCL_PTR_HOST   0x1
#define NCCL_PTR_CUDA   0x2
#define NCCL_PTR_DMABUF 0x4

#define NCCL_NET_MR_FLAG_FORCE_SO (1 << 0)

#define NCCL_NET_MAX_REQUESTS    32
#define NCCL_NET_MAX_REQUESTS_V6 8
#define NCCL_NET_MAX_PLUGINS     16

#define NCCL_NET_MAX_DEVS_PER_NIC_V9  4
#define NCCL_NET_MAX_DEVS_PER_NIC_V10 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ATTR_UNDEF          (-1)
#define NCCL_NET_ID_UNDEF            (-1)

/* ------------------------------------------------------------------ */
/* Device offload handle (net_device.h)                                */
/* ------------------------------------------------------------------ */
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0
#define NCCL_NET_MTU_SIZE               4096
#define NCCL_NET_DEVICE_UNPACK_VERSION  0x7

typedef enum {
  NCCL_NET_DEVICE_HOST      = 0,
  NCCL_NET_DEVICE_UNPACK    = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
  NCCL_NET_DEVICE_GIN_GPI   = 4
} ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int               netDeviceVersion;
  void*             handle;
  size_t            size;
  int               needsProxyProgress;
} ncclNetDeviceHandle_v7_t;                             /* 32 bytes */

typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v12_t;

/* ------------------------------------------------------------------ */
/* Virtual devices, per-comm config, attributes                        */
/* ------------------------------------------------------------------ */
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;                             /* 20 bytes */
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;                            /* 36 bytes */

typedef struct {
  int trafficClass;  /* NCCL_NET_TRAFFIC_CLASS_UNDEF unless set */
} ncclNetCommConfig_v10_t;                              /* 4 bytes */
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;                                /* 16 bytes */
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t;                                    /* 44 bytes */
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

/* ------------------------------------------------------------------ */
/* Device properties                                                   */
/* ------------------------------------------------------------------ */
typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      speed;      /* Mbps */
  int      port;
  float    latency;    /* usec */
  int      maxComms;
  int      maxRecvs;
} ncclNetProperties_v6_t;                               /* 48 bytes */

typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      speed;
  int      port;
  float    latency;
  int      maxComms;
  int      maxRecvs;
  ncclNetDeviceType netDeviceType;
  int      netDeviceVersion;
} ncclNetProperties_v7_t;                               /* 56 bytes */

typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      regIsGlobal;
  int      speed;
  int      port;
  float    latency;
  int      maxComms;
  int      maxRecvs;
  ncclNetDeviceType netDeviceType;
  int      netDeviceVersion;
} ncclNetProperties_v8_t;                               /* 64 bytes */

typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      regIsGlobal;
  int      forceFlush;
  int      speed;
  int      port;
  float    latency;
  int      maxComms;
  int      maxRecvs;
  ncclNetDeviceType netDeviceType;
  int      netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t   maxP2pBytes;
  size_t   maxCollBytes;
} ncclNetProperties_v9_t;                               /* 104 bytes */
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      regIsGlobal;
  int      forceFlush;
  int      speed;
  int      port;
  float    latency;
  int      maxComms;
  int      maxRecvs;
  ncclNetDeviceType netDeviceType;
  int      netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t   maxP2pBytes;
  size_t   maxCollBytes;
  int      maxMultiRequestSize;
} ncclNetProperties_v11_t;                              /* 112 bytes */

typedef struct {
  char*    name;
  char*    pciPath;
  uint64_t guid;
  int      ptrSupport;
  int      regIsGlobal;
  int      forceFlush;
  int      speed;
  int      port;
  float    latency;
  int      maxComms;
  int      maxRecvs;
  ncclNetDeviceType netDeviceType;
  int      netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t   maxP2pBytes;
  size_t   maxCollBytes;
  int      maxMultiRequestSize;
  int16_t  railId;   /* NCCL_NET_ID_UNDEF if unknown */
  int16_t  planeId;  /* NCCL_NET_ID_UNDEF if unknown */
} ncclNetProperties_v12_t;                              /* 128 bytes */

/* ------------------------------------------------------------------ */
/* Plugin tables                                                       */
/* ------------------------------------------------------------------ */
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclNet_v6_t;                                         /* 136 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v7_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v7_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v7_t;                                         /* 152 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;                                         /* 152 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;                                         /* 160 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm, ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;                                        /* 160 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v11_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;                                        /* 176 bytes */

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;                                        /* 176 bytes */

/* ------------------------------------------------------------------ */
/* Exported tables (data symbols looked up by NCCL with dlsym)         */
/* ------------------------------------------------------------------ */
extern const ncclNet_v6_t  ncclNetPlugin_v6;
extern const ncclNet_v7_t  ncclNetPlugin_v7;
extern const ncclNet_v8_t  ncclNetPlugin_v8;
extern const ncclNet_v9_t  ncclNetPlugin_v9;
extern const ncclNet_v10_t ncclNetPlugin_v10;
extern const ncclNet_v11_t ncclNetPlugin_v11;
extern const ncclNet_v12_t ncclNetPlugin_v12;

#ifdef __cplusplus
}
#endif

#endif /* RIVET_NET_H */
