/* A stand-in libcuda.so.1 for tests/cuda.rs, so the host-only fallback is tested on machines
 * without a GPU. Built twice: with -DFAKE_PARTIAL it exports only cuInit and cuGetErrorName (a
 * driver too old for rivet); without, every entry point rivet uses exists and cuInit fails with
 * CUDA_ERROR_NO_DEVICE, as on a host whose driver sees no GPU. */
int cuInit(unsigned flags) { (void)flags; return 100; }
int cuGetErrorName(int e, const char **s) { *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0; }
#ifndef FAKE_PARTIAL
int cuDriverGetVersion(void) { return 999; }
int cuDeviceGetCount(void) { return 999; }
int cuDeviceGet(void) { return 999; }
int cuDeviceGetAttribute(void) { return 999; }
int cuDeviceGetPCIBusId(void) { return 999; }
int cuDevicePrimaryCtxRetain(void) { return 999; }
int cuDevicePrimaryCtxRelease_v2(void) { return 999; }
int cuPointerGetAttribute(void) { return 999; }
int cuCtxGetCurrent(void) { return 999; }
int cuCtxGetDevice(void) { return 999; }
int cuCtxPushCurrent_v2(void) { return 999; }
int cuCtxPopCurrent_v2(void) { return 999; }
int cuStreamCreate(void) { return 999; }
int cuStreamQuery(void) { return 999; }
int cuStreamDestroy_v2(void) { return 999; }
int cuEventCreate(void) { return 999; }
int cuEventRecord(void) { return 999; }
int cuEventQuery(void) { return 999; }
int cuEventDestroy_v2(void) { return 999; }
int cuMemcpyDtoHAsync_v2(void) { return 999; }
int cuMemcpyHtoDAsync_v2(void) { return 999; }
int cuMemAlloc_v2(void) { return 999; }
int cuMemFree_v2(void) { return 999; }
int cuMemcpyHtoD_v2(void) { return 999; }
int cuMemcpyDtoH_v2(void) { return 999; }
int cuMemHostAlloc(void) { return 999; }
int cuMemFreeHost(void) { return 999; }
#endif
