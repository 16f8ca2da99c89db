/*
 * layout.c - compile-time ABI layout checks for include/rivet_net.h.
 *
 * Every size and offset below is the value measured from NCCL's own
 * headers with gcc on x86_64 (see shared/reference/ncclnet-abi.md §4).
 * Build:  cc -std=c11 -Wall -Wextra -Werror tests/c/layout.c -o /tmp/layout
 */
#include <stdio.h>
#include <stddef.h>
#include "../../include/rivet_net.h"

#define SIZE(T, n)      _Static_assert(sizeof(T) == (n), "sizeof(" #T ") != " #n)
#define OFF(T, m, n)    _Static_assert(offsetof(T, m) == (n), "offsetof(" #T ", " #m ") != " #n)

/* enums are 4-byte ints */
SIZE(ncclResult_t, 4);
SIZE(ncclDebugLogLevel, 4);
SIZE(ncclNetDeviceType, 4);
_Static_assert(ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclTimeout == 8, "result codes");
_Static_assert(NCCL_NET_HANDLE_MAXSIZE == 128, "handle size");
_Static_assert(NCCL_NET_MAX_REQUESTS == 32, "max requests");

/* §4.1 device handle */
SIZE(ncclNetDeviceHandle_v7_t, 32);
OFF(ncclNetDeviceHandle_v7_t, netDeviceType, 0);
OFF(ncclNetDeviceHandle_v7_t, netDeviceVersion, 4);
OFF(ncclNetDeviceHandle_v7_t, handle, 8);
OFF(ncclNetDeviceHandle_v7_t, size, 16);
OFF(ncclNetDeviceHandle_v7_t, needsProxyProgress, 24);
SIZE(ncclNetDeviceHandle_v12_t, 32);

/* §4.2 vProps */
SIZE(ncclNetVDeviceProps_v9_t, 20);
SIZE(ncclNetVDeviceProps_v10_t, 20);
SIZE(ncclNetVDeviceProps_v11_t, 20);
SIZE(ncclNetVDeviceProps_v12_t, 36);
OFF(ncclNetVDeviceProps_v12_t, devs, 4);

/* §4.3 / §4.4 */
SIZE(ncclNetCommConfig_v10_t, 4);
SIZE(ncclNetCommConfig_v11_t, 4);
SIZE(ncclNetCommConfig_v12_t, 4);
SIZE(ncclNetCommAttr_v11_t, 16);
SIZE(ncclNetCommAttr_v12_t, 16);
OFF(ncclNetCommAttr_v12_t, minFlowsPerPeer, 12);
SIZE(ncclNetAttr_v11_t, 44);
SIZE(ncclNetAttr_v12_t, 44);
OFF(ncclNetAttr_v12_t, recvCommAttr, 16);
OFF(ncclNetAttr_v12_t, op, 32);
OFF(ncclNetAttr_v12_t, algo, 36);
OFF(ncclNetAttr_v12_t, proto, 40);

/* §4.5 properties v6 */
SIZE(ncclNetProperties_v6_t, 48);
OFF(ncclNetProperties_v6_t, name, 0);
OFF(ncclNetProperties_v6_t, pciPath, 8);
OFF(ncclNetProperties_v6_t, guid, 16);
OFF(ncclNetProperties_v6_t, ptrSupport, 24);
OFF(ncclNetProperties_v6_t, speed, 28);
OFF(ncclNetProperties_v6_t, port, 32);
OFF(ncclNetProperties_v6_t, latency, 36);
OFF(ncclNetProperties_v6_t, maxComms, 40);
OFF(ncclNetProperties_v6_t, maxRecvs, 44);

/* §4.6 properties v7 */
SIZE(ncclNetProperties_v7_t, 56);
OFF(ncclNetProperties_v7_t, name, 0);
OFF(ncclNetProperties_v7_t, pciPath, 8);
OFF(ncclNetProperties_v7_t, guid, 16);
OFF(ncclNetProperties_v7_t, ptrSupport, 24);
OFF(ncclNetProperties_v7_t, speed, 28);
OFF(ncclNetProperties_v7_t, port, 32);
OFF(ncclNetProperties_v7_t, latency, 36);
OFF(ncclNetProperties_v7_t, maxComms, 40);
OFF(ncclNetProperties_v7_t, maxRecvs, 44);
OFF(ncclNetProperties_v7_t, netDeviceType, 48);
OFF(ncclNetProperties_v7_t, netDeviceVersion, 52);

/* §4.7 properties v8 */
SIZE(ncclNetProperties_v8_t, 64);
OFF(ncclNetProperties_v8_t, name, 0);
OFF(ncclNetProperties_v8_t, pciPath, 8);
OFF(ncclNetProperties_v8_t, guid, 16);
OFF(ncclNetProperties_v8_t, ptrSupport, 24);
OFF(ncclNetProperties_v8_t, regIsGlobal, 28);
OFF(ncclNetProperties_v8_t, speed, 32);
OFF(ncclNetProperties_v8_t, port, 36);
OFF(ncclNetProperties_v8_t, latency, 40);
OFF(ncclNetProperties_v8_t, maxComms, 44);
OFF(ncclNetProperties_v8_t, maxRecvs, 48);
OFF(ncclNetProperties_v8_t, netDeviceType, 52);
OFF(ncclNetProperties_v8_t, netDeviceVersion, 56);

/* §4.8 properties v9 / v10 (and the common prefix of v11 / v12) */
#define CHECK_PROPS_V9_PREFIX(T)              \
  OFF(T, name, 0);                            \
  OFF(T, pciPath, 8);                         \
  OFF(T, guid, 16);                           \
  OFF(T, ptrSupport, 24);                     \
  OFF(T, regIsGlobal, 28);                    \
  OFF(T, forceFlush, 32);                     \
  OFF(T, speed, 36);                          \
  OFF(T, port, 40);                           \
  OFF(T, latency, 44);                        \
  OFF(T, maxComms, 48);                       \
  OFF(T, maxRecvs, 52);                       \
  OFF(T, netDeviceType, 56);                  \
  OFF(T, netDeviceVersion, 60);               \
  OFF(T, vProps, 64)

SIZE(ncclNetProperties_v9_t, 104);
CHECK_PROPS_V9_PREFIX(ncclNetProperties_v9_t);
OFF(ncclNetProperties_v9_t, maxP2pBytes, 88);
OFF(ncclNetProperties_v9_t, maxCollBytes, 96);

SIZE(ncclNetProperties_v10_t, 104);
CHECK_PROPS_V9_PREFIX(ncclNetProperties_v10_t);
OFF(ncclNetProperties_v10_t, maxP2pBytes, 88);
OFF(ncclNetProperties_v10_t, maxCollBytes, 96);

/* §4.9 properties v11 */
SIZE(ncclNetProperties_v11_t, 112);
CHECK_PROPS_V9_PREFIX(ncclNetProperties_v11_t);
OFF(ncclNetProperties_v11_t, maxP2pBytes, 88);
OFF(ncclNetProperties_v11_t, maxCollBytes, 96);
OFF(ncclNetProperties_v11_t, maxMultiRequestSize, 104);

/* §4.10 properties v12 */
SIZE(ncclNetProperties_v12_t, 128);
CHECK_PROPS_V9_PREFIX(ncclNetProperties_v12_t);
OFF(ncclNetProperties_v12_t, maxP2pBytes, 104);
OFF(ncclNetProperties_v12_t, maxCollBytes, 112);
OFF(ncclNetProperties_v12_t, maxMultiRequestSize, 120);
OFF(ncclNetProperties_v12_t, railId, 124);
OFF(ncclNetProperties_v12_t, planeId, 126);

/* §4.11 – §4.17 plugin tables: one pointer per member */
#define P(i) ((i) * 8)
#define CHECK_NET_COMMON(T)                   \
  OFF(T, name, P(0));                         \
  OFF(T, init, P(1));                         \
  OFF(T, devices, P(2));                      \
  OFF(T, getProperties, P(3));                \
  OFF(T, listen, P(4));                       \
  OFF(T, connect, P(5));                      \
  OFF(T, accept, P(6));                       \
  OFF(T, regMr, P(7));                        \
  OFF(T, regMrDmaBuf, P(8));                  \
  OFF(T, deregMr, P(9));                      \
  OFF(T, isend, P(10));                       \
  OFF(T, irecv, P(11));                       \
  OFF(T, iflush, P(12));                      \
  OFF(T, test, P(13));                        \
  OFF(T, closeSend, P(14));                   \
  OFF(T, closeRecv, P(15));                   \
  OFF(T, closeListen, P(16))
#define CHECK_NET_V7(T)                       \
  CHECK_NET_COMMON(T);                        \
  OFF(T, getDeviceMr, P(17));                 \
  OFF(T, irecvConsumed, P(18))
#define CHECK_NET_V9(T)                       \
  CHECK_NET_V7(T);                            \
  OFF(T, makeVDevice, P(19))
#define CHECK_NET_V11(T)                      \
  CHECK_NET_V9(T);                            \
  OFF(T, finalize, P(20));                    \
  OFF(T, setNetAttr, P(21))

SIZE(ncclNet_v6_t, 136);
CHECK_NET_COMMON(ncclNet_v6_t);
SIZE(ncclNet_v7_t, 152);
CHECK_NET_V7(ncclNet_v7_t);
SIZE(ncclNet_v8_t, 152);
CHECK_NET_V7(ncclNet_v8_t);
SIZE(ncclNet_v9_t, 160);
CHECK_NET_V9(ncclNet_v9_t);
SIZE(ncclNet_v10_t, 160);
CHECK_NET_V9(ncclNet_v10_t);
SIZE(ncclNet_v11_t, 176);
CHECK_NET_V11(ncclNet_v11_t);
SIZE(ncclNet_v12_t, 176);
CHECK_NET_V11(ncclNet_v12_t);

#define PRINT(T) printf("%s %zu\n", #T, sizeof(T))

int main(void) {
  PRINT(ncclNetDeviceHandle_v7_t);
  PRINT(ncclNetVDeviceProps_v9_t);
  PRINT(ncclNetVDeviceProps_v12_t);
  PRINT(ncclNetCommConfig_v10_t);
  PRINT(ncclNetCommAttr_v11_t);
  PRINT(ncclNetAttr_v11_t);
  PRINT(ncclNetProperties_v6_t);
  PRINT(ncclNetProperties_v7_t);
  PRINT(ncclNetProperties_v8_t);
  PRINT(ncclNetProperties_v9_t);
  PRINT(ncclNetProperties_v10_t);
  PRINT(ncclNetProperties_v11_t);
  PRINT(ncclNetProperties_v12_t);
  PRINT(ncclNet_v6_t);
  PRINT(ncclNet_v7_t);
  PRINT(ncclNet_v8_t);
  PRINT(ncclNet_v9_t);
  PRINT(ncclNet_v10_t);
  PRINT(ncclNet_v11_t);
  PRINT(ncclNet_v12_t);
  return 0;
}
