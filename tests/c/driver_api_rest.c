/*
 * The rest of the driver API's headers, called from C against vgpu's libcuda.so: what a VM's
 * device does not have is refused the way CUDA refuses it on such a device, so that programs
 * linked against these functions load and take their other paths.
 *
 * - OpenGL, EGL and VDPAU interop (cudaGL.h, cudaEGL.h, cudaVDPAU.h): no graphics context or
 *   device of the guest is on vgpu's device; no resource, EGL connection or buffer object exists;
 * - external memory and semaphores: imports refused after the descriptor is checked, every
 *   handle invalid, no graph node is an external semaphore node;
 * - checkpoints, core dumps, tensor maps, decompression, dma-buf handles, CIG capture, fabric
 *   and logical endpoints: CUDA_ERROR_NOT_SUPPORTED;
 * - the profiler's start and stop, GPUDirect RDMA flushes (checked arguments, no RDMA);
 * - CUDA 2.0's cuCtxAttach/cuCtxDetach (uses counted, the last destroys a created context) and
 *   cuTexRefCreate/cuTexRefDestroy (a reference outside any module keeps its state);
 * - CUDA 13.1's cuLaunchHostFunc_v2 (the function runs, a bad sync mode is refused).
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUhandle;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_CONTEXT = 201,
    INVALID_GRAPHICS_CONTEXT = 219,
    INVALID_HANDLE = 400,
    NOT_SUPPORTED = 801,
};

/* CUDA_EXTERNAL_MEMORY_HANDLE_DESC and CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC (their first member is
 * the handle type; the rest is sized generously). */
typedef struct {
    unsigned int type;
    unsigned int pad;
    unsigned long long rest[16];
} HandleDesc;

/* CUDA_EXT_SEM_SIGNAL_NODE_PARAMS. */
typedef struct {
    CUhandle *sems;
    const void *params;
    unsigned int count;
} SemNodeParams;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuCtxCreate_v2(CUhandle *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUhandle);
CUresult cuCtxGetCurrent(CUhandle *);
CUresult cuCtxSetCurrent(CUhandle);
CUresult cuCtxAttach(CUhandle *, unsigned int);
CUresult cuCtxDetach(CUhandle);
CUresult cuCtxSynchronize(void);
CUresult cuDevicePrimaryCtxRetain(CUhandle *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuStreamCreate(CUhandle *, unsigned int);
CUresult cuStreamDestroy_v2(CUhandle);
CUresult cuStreamSynchronize(CUhandle);
CUresult cuGraphCreate(CUhandle *, unsigned int);
CUresult cuGraphDestroy(CUhandle);
CUresult cuGraphAddEmptyNode(CUhandle *, CUhandle, const CUhandle *, size_t);

CUresult cuGLGetDevices_v2(unsigned int *, CUdevice *, unsigned int, int);
CUresult cuGraphicsGLRegisterBuffer(CUhandle *, unsigned int, unsigned int);
CUresult cuGraphicsGLRegisterImage(CUhandle *, unsigned int, unsigned int, unsigned int);
CUresult cuGLCtxCreate_v2(CUhandle *, unsigned int, CUdevice);
CUresult cuGLInit(void);
CUresult cuGLMapBufferObject_v2(CUdeviceptr *, size_t *, unsigned int);
CUresult cuGLUnregisterBufferObject(unsigned int);
CUresult cuGraphicsMapResources(unsigned int, CUhandle *, CUhandle);
CUresult cuGraphicsUnregisterResource(CUhandle);
CUresult cuGraphicsResourceGetMappedPointer_v2(CUdeviceptr *, size_t *, CUhandle);
CUresult cuGraphicsEGLRegisterImage(CUhandle *, void *, unsigned int);
CUresult cuEGLStreamConsumerConnect(CUhandle *, void *);
CUresult cuEGLStreamConsumerDisconnect(CUhandle *);
CUresult cuEventCreateFromEGLSync(CUhandle *, void *, unsigned int);
CUresult cuVDPAUGetDevice(CUdevice *, unsigned int, void *);
CUresult cuGraphicsVDPAURegisterVideoSurface(CUhandle *, unsigned int, unsigned int);

CUresult cuImportExternalMemory(CUhandle *, const HandleDesc *);
CUresult cuImportExternalSemaphore(CUhandle *, const HandleDesc *);
CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *, CUhandle, const void *);
CUresult cuDestroyExternalMemory(CUhandle);
CUresult cuDestroyExternalSemaphore(CUhandle);
CUresult cuSignalExternalSemaphoresAsync(const CUhandle *, const void *, unsigned int, CUhandle);
CUresult cuWaitExternalSemaphoresAsync(const CUhandle *, const void *, unsigned int, CUhandle);
CUresult cuGraphAddExternalSemaphoresSignalNode(CUhandle *, CUhandle, const CUhandle *, size_t,
                                                const SemNodeParams *);
CUresult cuGraphExternalSemaphoresWaitNodeGetParams(CUhandle, SemNodeParams *);

CUresult cuCheckpointProcessGetState(int, int *);
CUresult cuCoredumpGetAttribute(int, void *, size_t *);
CUresult cuTensorMapEncodeIm2col(void *, int, unsigned int, void *, const void *, const void *,
                                 const int *, const int *, unsigned int, unsigned int,
                                 const unsigned int *, int, int, int, int);
CUresult cuMemGetHandleForAddressRange(void *, CUdeviceptr, size_t, int, unsigned long long);
CUresult cuDeviceGetLuid(char *, unsigned int *, CUdevice);
CUresult cuProfilerStart(void);
CUresult cuProfilerStop(void);
CUresult cuFlushGPUDirectRDMAWrites(int, int);
CUresult cuMipmappedArrayGetSparseProperties(void *, CUhandle);

CUresult cuTexRefCreate(CUhandle *);
CUresult cuTexRefDestroy(CUhandle);
CUresult cuTexRefSetFilterMode(CUhandle, int);
CUresult cuTexRefGetFilterMode(int *, CUhandle);
CUresult cuTexRefSetAddress_v2(size_t *, CUhandle, CUdeviceptr, size_t);
CUresult cuTexRefGetAddress_v2(CUdeviceptr *, CUhandle);

typedef void (*HostFn)(void *);
CUresult cuLaunchHostFunc_v2(CUhandle, HostFn, void *, unsigned int);

/* CU_DEVICE_ATTRIBUTE_* the refusals go with. */
enum {
    ATTR_TIMELINE_SEMAPHORE_INTEROP = 114,
    ATTR_GPU_DIRECT_RDMA_SUPPORTED = 116,
    ATTR_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 117,
    ATTR_DMA_BUF_SUPPORTED = 124,
    ATTR_TENSOR_MAP_ACCESS_SUPPORTED = 127,
    ATTR_MEM_DECOMPRESS_ALGORITHM_MASK = 136,
};

static void graphics(void) {
    unsigned int count = 7;
    CUdevice devs[4];
    CUhandle res = NULL;
    CUdeviceptr ptr;
    size_t size;
    check("cuGLGetDevices: no CUDA device runs the guest's GL context",
          cuGLGetDevices_v2(&count, devs, 4, 1), NO_DEVICE);
    expect("cuGLGetDevices counts none", count == 0);
    check("cuGLGetDevices without a count", cuGLGetDevices_v2(NULL, devs, 4, 1), INVALID_VALUE);
    check("cuGraphicsGLRegisterBuffer", cuGraphicsGLRegisterBuffer(&res, 1, 0),
          INVALID_GRAPHICS_CONTEXT);
    check("cuGraphicsGLRegisterImage", cuGraphicsGLRegisterImage(&res, 1, 0x0DE1, 0),
          INVALID_GRAPHICS_CONTEXT);
    check("cuGLInit", cuGLInit(), SUCCESS);
    check("cuGLMapBufferObject of a buffer never registered",
          cuGLMapBufferObject_v2(&ptr, &size, 1), INVALID_HANDLE);
    check("cuGLUnregisterBufferObject", cuGLUnregisterBufferObject(1), INVALID_HANDLE);
    check("cuGraphicsMapResources of a forged resource",
          cuGraphicsMapResources(1, &res, NULL), INVALID_HANDLE);
    check("cuGraphicsMapResources of none", cuGraphicsMapResources(0, NULL, NULL),
          INVALID_VALUE);
    check("cuGraphicsResourceGetMappedPointer",
          cuGraphicsResourceGetMappedPointer_v2(&ptr, &size, (CUhandle)0x1234), INVALID_HANDLE);
    check("cuGraphicsUnregisterResource", cuGraphicsUnregisterResource((CUhandle)0x1234),
          INVALID_HANDLE);
    check("cuGraphicsEGLRegisterImage", cuGraphicsEGLRegisterImage(&res, (void *)0x10, 0),
          NOT_SUPPORTED);
    check("cuEGLStreamConsumerConnect", cuEGLStreamConsumerConnect(&res, (void *)0x10),
          NOT_SUPPORTED);
    check("cuEGLStreamConsumerDisconnect of no connection", cuEGLStreamConsumerDisconnect(&res),
          INVALID_HANDLE);
    check("cuEventCreateFromEGLSync", cuEventCreateFromEGLSync(&res, (void *)0x10, 0),
          NOT_SUPPORTED);
    CUdevice dev = -1;
    check("cuVDPAUGetDevice: no CUDA device is the guest's VDPAU device",
          cuVDPAUGetDevice(&dev, 1, (void *)0x10), NO_DEVICE);
    check("cuGraphicsVDPAURegisterVideoSurface",
          cuGraphicsVDPAURegisterVideoSurface(&res, 1, 0), NOT_SUPPORTED);
}

static void external(CUhandle stream) {
    HandleDesc desc;
    CUhandle mem = NULL, sem = (CUhandle)0x1234, node = NULL, graph = NULL, empty = NULL;
    CUdeviceptr ptr;
    unsigned long long buffer_desc[8] = {0};
    unsigned long long signal_params[18] = {0};
    memset(&desc, 0, sizeof desc);
    desc.type = 1; /* CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD */
    check("cuImportExternalMemory of an opaque fd", cuImportExternalMemory(&mem, &desc),
          NOT_SUPPORTED);
    desc.type = 0;
    check("cuImportExternalMemory of handle type 0", cuImportExternalMemory(&mem, &desc),
          INVALID_VALUE);
    check("cuImportExternalMemory without a descriptor", cuImportExternalMemory(&mem, NULL),
          INVALID_VALUE);
    desc.type = 9; /* CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD */
    check("cuImportExternalSemaphore of a timeline semaphore",
          cuImportExternalSemaphore(&sem, &desc), NOT_SUPPORTED);
    check("cuExternalMemoryGetMappedBuffer of a forged handle",
          cuExternalMemoryGetMappedBuffer(&ptr, (CUhandle)0x1234, buffer_desc), INVALID_HANDLE);
    check("cuDestroyExternalMemory", cuDestroyExternalMemory((CUhandle)0x1234), INVALID_HANDLE);
    check("cuDestroyExternalSemaphore", cuDestroyExternalSemaphore(sem), INVALID_HANDLE);
    check("cuSignalExternalSemaphoresAsync of a forged semaphore",
          cuSignalExternalSemaphoresAsync(&sem, signal_params, 1, stream), INVALID_HANDLE);
    check("cuWaitExternalSemaphoresAsync of none",
          cuWaitExternalSemaphoresAsync(NULL, NULL, 0, stream), SUCCESS);
    check("the stream goes on", cuStreamSynchronize(stream), SUCCESS);

    check("cuGraphCreate", cuGraphCreate(&graph, 0), SUCCESS);
    SemNodeParams p = {&sem, signal_params, 1};
    check("cuGraphAddExternalSemaphoresSignalNode",
          cuGraphAddExternalSemaphoresSignalNode(&node, graph, NULL, 0, &p), INVALID_HANDLE);
    check("cuGraphAddEmptyNode", cuGraphAddEmptyNode(&empty, graph, NULL, 0), SUCCESS);
    check("an empty node is no external semaphore node",
          cuGraphExternalSemaphoresWaitNodeGetParams(empty, &p), INVALID_VALUE);
    check("cuGraphDestroy", cuGraphDestroy(graph), SUCCESS);
}

static void absent_features(CUdevice dev) {
    int value = -1;
    size_t size = sizeof value;
    unsigned char tensor_map[128];
    char luid[8];
    unsigned int mask;
    check("cuCheckpointProcessGetState", cuCheckpointProcessGetState(1, &value), NOT_SUPPORTED);
    check("cuCoredumpGetAttribute", cuCoredumpGetAttribute(1, &value, &size), NOT_SUPPORTED);
    check("cuTensorMapEncodeIm2col",
          cuTensorMapEncodeIm2col(tensor_map, 7, 3, NULL, NULL, NULL, NULL, NULL, 0, 0, NULL, 0,
                                  0, 0, 0),
          NOT_SUPPORTED);
    check("cuMemGetHandleForAddressRange",
          cuMemGetHandleForAddressRange(&value, 0x1000, 4096, 1, 0), NOT_SUPPORTED);
    check("cuDeviceGetLuid (Windows only)", cuDeviceGetLuid(luid, &mask, dev), NOT_SUPPORTED);
    check("cuMipmappedArrayGetSparseProperties: no mipmapped array",
          cuMipmappedArrayGetSparseProperties(tensor_map, (CUhandle)0x1234), INVALID_HANDLE);
    /* The device says so too. */
    const int none[] = {ATTR_TIMELINE_SEMAPHORE_INTEROP, ATTR_GPU_DIRECT_RDMA_SUPPORTED,
                        ATTR_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, ATTR_DMA_BUF_SUPPORTED,
                        ATTR_TENSOR_MAP_ACCESS_SUPPORTED, ATTR_MEM_DECOMPRESS_ALGORITHM_MASK};
    for (unsigned i = 0; i < sizeof none / sizeof none[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "device attribute %d is 0", none[i]);
        value = -1;
        check(what, cuDeviceGetAttribute(&value, none[i], dev), SUCCESS);
        expect(what, value == 0);
    }
    check("cuFlushGPUDirectRDMAWrites (no RDMA)", cuFlushGPUDirectRDMAWrites(0, 100),
          NOT_SUPPORTED);
    check("cuFlushGPUDirectRDMAWrites to a bad scope", cuFlushGPUDirectRDMAWrites(0, 7),
          INVALID_VALUE);
    check("cuProfilerStart", cuProfilerStart(), SUCCESS);
    check("cuProfilerStop", cuProfilerStop(), SUCCESS);
}

static void attach_detach(CUdevice dev) {
    CUhandle ctx = NULL, attached = NULL, cur = NULL, primary = NULL;
    CUdeviceptr p;
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), SUCCESS);
    check("cuCtxAttach with flags", cuCtxAttach(&attached, 1), INVALID_VALUE);
    check("cuCtxAttach", cuCtxAttach(&attached, 0), SUCCESS);
    expect("cuCtxAttach gives the current context", attached == ctx);
    check("cuCtxDetach of one use", cuCtxDetach(ctx), SUCCESS);
    check("the context lives on", cuMemAlloc_v2(&p, 4096), SUCCESS);
    check("cuMemFree", cuMemFree_v2(p), SUCCESS);
    check("cuCtxDetach of its last use", cuCtxDetach(ctx), SUCCESS);
    check("cuCtxGetCurrent", cuCtxGetCurrent(&cur), SUCCESS);
    expect("the destroyed context is not current", cur == NULL);
    check("cuCtxDetach of a destroyed context", cuCtxDetach(ctx), INVALID_CONTEXT);
    check("cuCtxAttach without a context", cuCtxAttach(&attached, 0), INVALID_CONTEXT);

    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&primary, dev), SUCCESS);
    check("cuCtxSetCurrent", cuCtxSetCurrent(primary), SUCCESS);
    check("cuCtxAttach of the primary context", cuCtxAttach(&attached, 0), SUCCESS);
    check("cuCtxDetach of the primary context", cuCtxDetach(primary), SUCCESS);
    check("a primary context is not destroyed by detaching", cuCtxDetach(primary),
          INVALID_CONTEXT);
    check("the primary context lives on", cuCtxSynchronize(), SUCCESS);
}

static void texref_outside_modules(void) {
    CUhandle t = NULL;
    CUdeviceptr p, got = 0;
    size_t offset = 1;
    int filter = -1;
    check("cuTexRefCreate", cuTexRefCreate(&t), SUCCESS);
    check("cuTexRefSetFilterMode", cuTexRefSetFilterMode(t, 1), SUCCESS);
    check("cuTexRefGetFilterMode", cuTexRefGetFilterMode(&filter, t), SUCCESS);
    expect("the reference keeps its filter mode", filter == 1);
    check("cuMemAlloc", cuMemAlloc_v2(&p, 1 << 16), SUCCESS);
    check("cuTexRefSetAddress", cuTexRefSetAddress_v2(&offset, t, p, 1 << 16), SUCCESS);
    check("cuTexRefGetAddress", cuTexRefGetAddress_v2(&got, t), SUCCESS);
    expect("the reference is bound to the memory", got == p && offset == 0);
    check("cuTexRefDestroy", cuTexRefDestroy(t), SUCCESS);
    check("cuTexRefDestroy twice", cuTexRefDestroy(t), INVALID_HANDLE);
    check("cuTexRefGetFilterMode after cuTexRefDestroy", cuTexRefGetFilterMode(&filter, t),
          INVALID_HANDLE);
    check("cuMemFree", cuMemFree_v2(p), SUCCESS);
}

static void bump(void *arg) { ++*(int *)arg; }

static void host_func_v2(CUhandle stream) {
    int ran = 0;
    check("cuLaunchHostFunc_v2 (spin-wait mode)", cuLaunchHostFunc_v2(stream, bump, &ran, 1),
          SUCCESS);
    check("cuLaunchHostFunc_v2 (blocking mode)", cuLaunchHostFunc_v2(stream, bump, &ran, 0),
          SUCCESS);
    check("cuStreamSynchronize", cuStreamSynchronize(stream), SUCCESS);
    expect("both host functions ran", ran == 2);
    check("cuLaunchHostFunc_v2 with an unknown sync mode",
          cuLaunchHostFunc_v2(stream, bump, &ran, 2), INVALID_VALUE);
}

int main(void) {
    CUdevice dev;
    CUhandle ctx, stream;
    unsigned int count;
    check("cuGLGetDevices before cuInit", cuGLGetDevices_v2(&count, NULL, 0, 1),
          NOT_INITIALIZED);
    check("cuInit", cuInit(0), SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), SUCCESS);
    check("cuProfilerStart without a context", cuProfilerStart(), INVALID_CONTEXT);
    check("cuGLCtxCreate (a plain context)", cuGLCtxCreate_v2(&ctx, 0, dev), SUCCESS);
    check("cuStreamCreate", cuStreamCreate(&stream, 0), SUCCESS);
    graphics();
    external(stream);
    absent_features(dev);
    texref_outside_modules();
    host_func_v2(stream);
    check("cuStreamDestroy", cuStreamDestroy_v2(stream), SUCCESS);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), SUCCESS);
    attach_detach(dev);
    check("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2(dev), SUCCESS);
    printf("# driver_api_rest: %d failed\n", failures);
    return failures;
}
