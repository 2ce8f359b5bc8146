/*
 * The allocation APIs beyond cuMemAlloc, from a plain C program against vgpu's libcuda.so:
 *
 *   alloc_api mapped           cuMemHostAlloc (every flag), cuMemHostRegister DEVICEMAP: kernels
 *                              read and write the guest's host memory
 *   alloc_api managed          cuMemAllocManaged: one pointer on the host and in kernels,
 *                              attach, prefetch, advise, range and pointer attributes
 *   alloc_api pools            cuMemAllocAsync/FreeAsync, default and created pools, attributes,
 *                              release threshold, trim, access, sharing refused
 *   alloc_api vmm              cuMemCreate/AddressReserve/Map/SetAccess/Retain/Export/Import
 *   alloc_api vmm-export       export 2 MiB as a fabric handle, print it, hold it
 *   alloc_api vmm-import HEX CODE   import a fabric handle, expecting CODE
 *   alloc_api fill KIND        allocate KIND (managed|mapped|registered|pool|vmm) at a time
 *                              until CUDA_ERROR_OUT_OF_MEMORY; free (or trim) everything; the
 *                              slice is whole again
 *   alloc_api hold KIND BYTES  allocate BYTES of KIND, print "holding", sleep (to be killed)
 *   alloc_api bench MIB        launch + synchronize over MIB of managed memory: the mirror cost
 *   alloc_api delta            16 MiB of managed memory, touched a page at a time: only changed
 *                              pages move (vgpud's byte counters show it to the caller)
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUmemoryPool;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuDeviceGetAttribute(int *, int, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);
CUresult cuMemFreeHost(void *);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned int);
CUresult cuMemHostGetFlags(unsigned int *, void *);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned int);
CUresult cuMemHostUnregister(void *);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuStreamAttachMemAsync(CUstream, CUdeviceptr, size_t, unsigned int);
CUresult cuMemPrefetchAsync(CUdeviceptr, size_t, int, CUstream);
/* CUDA 13's batches need CONCURRENT_MANAGED_ACCESS, which a VM's device has not. */
CUresult cuMemPrefetchBatchAsync(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *, size_t,
                                 unsigned long long, CUstream);
CUresult cuMemDiscardBatchAsync(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream);
CUresult cuMemAdvise(CUdeviceptr, size_t, int, int);
CUresult cuMemRangeGetAttribute(void *, size_t, int, CUdeviceptr, size_t);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuPointerGetAttributes(unsigned int, int *, void **, CUdeviceptr);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, int);
CUresult cuDeviceGetMemPool(CUmemoryPool *, int);
CUresult cuDeviceSetMemPool(int, CUmemoryPool);
CUresult cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemSetMemPool(CUmemLocation *, int, CUmemoryPool);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolSetAccess(CUmemoryPool, const CUmemAccessDesc *, size_t);
CUresult cuMemPoolGetAccess(int *, CUmemoryPool, CUmemLocation *);
CUresult cuMemPoolExportPointer(void *, CUdeviceptr);
CUresult cuGetErrorName(CUresult, const char **);
typedef struct {
    int type, requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef unsigned long long CUmemGenericAllocationHandle;
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemMapArrayAsync(void *, unsigned, CUstream);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemGetAccess(unsigned long long *, const CUmemLocation *, CUdeviceptr);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *, CUmemGenericAllocationHandle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);

#define MIB (1024 * 1024)

static const char *INC_PTX =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry inc(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %pr;\n"
    "  .reg .b32 %r<7>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %pr, %r5, %r1;\n"
    "  @%pr bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  st.global.u32 [%rd4], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static CUfunction inc_fn;

static CUresult inc(CUdeviceptr p, unsigned n, CUstream s) {
    void *args[] = {&p, &n};
    return cuLaunchKernel(inc_fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

static void setup(void) {
    CUcontext ctx;
    CUmodule mod;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuModuleLoadData(&mod, INC_PTX) ||
        cuModuleGetFunction(&inc_fn, mod, "inc")) {
        printf("FAIL setup\n");
        exit(100);
    }
}

static int all_equal(const unsigned *p, size_t n, unsigned v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static void mapped(void) {
    const unsigned n = 10000;
    int attr = 0;
    check("CAN_MAP_HOST_MEMORY queried", cuDeviceGetAttribute(&attr, 19, 0), 0);
    expect("the device can map host memory", attr == 1);
    /* cuMemHostAlloc with every flag */
    unsigned *h = NULL;
    check("cuMemHostAlloc PORTABLE|DEVICEMAP|WRITECOMBINED", cuMemHostAlloc((void **)&h, n * 4, 7), 0);
    unsigned flags = 0;
    check("cuMemHostGetFlags", cuMemHostGetFlags(&flags, h), 0);
    expect("the flags are the ones given", flags == 7);
    CUdeviceptr d = 0;
    check("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2(&d, h, 0), 0);
    expect("the device pointer is the host pointer", d == (CUdeviceptr)(uintptr_t)h);
    for (unsigned i = 0; i < n; i++) h[i] = i;
    check("a kernel on mapped memory", inc(d, n, 0), 0);
    check("synchronize", cuCtxSynchronize(), 0);
    int good = 1;
    for (unsigned i = 0; i < n; i++) good &= h[i] == i + 1;
    expect("the host sees what the kernel wrote", good);
    /* Two launches without a synchronization in between: the second sees the first. */
    check("launch 1", inc(d, n, 0), 0);
    check("launch 2", inc(d, n, 0), 0);
    check("synchronize again", cuCtxSynchronize(), 0);
    good = 1;
    for (unsigned i = 0; i < n; i++) good &= h[i] == i + 3;
    expect("back-to-back kernels both count", good);
    unsigned back[4];
    check("cuMemcpyDtoH from mapped memory", cuMemcpyDtoH_v2(back, d + 8, sizeof back), 0);
    expect("it reads the mirror", back[0] == 5 && back[3] == 8);
    check("cuMemsetD32 on mapped memory", cuMemsetD32_v2(d, 9, n), 0);
    expect("the host sees the memset", all_equal(h, n, 9));
    int mt = 0;
    check("pointer attribute MEMORY_TYPE", cuPointerGetAttribute(&mt, 2, d), 0);
    expect("mapped memory is host memory", mt == 1);
    check("cuMemFreeHost", cuMemFreeHost(h), 0);

    /* Plain pinned memory has no device pointer here. */
    void *plain = NULL;
    check("cuMemHostAlloc PORTABLE", cuMemHostAlloc(&plain, 4096, 1), 0);
    check("cuMemHostGetFlags of plain pinned memory", cuMemHostGetFlags(&flags, plain), 0);
    expect("its flags", flags == 1);
    check("no device pointer without DEVICEMAP", cuMemHostGetDevicePointer_v2(&d, plain, 0), 1);
    check("cuMemFreeHost plain", cuMemFreeHost(plain), 0);

    /* cuMemHostRegister with DEVICEMAP: the guest's own memory. */
    unsigned *mine = aligned_alloc(4096, n * 4);
    for (unsigned i = 0; i < n; i++) mine[i] = 2 * i;
    check("cuMemHostRegister DEVICEMAP", cuMemHostRegister_v2(mine, n * 4, 2), 0);
    CUdeviceptr md = 0;
    check("its device pointer", cuMemHostGetDevicePointer_v2(&md, mine, 0), 0);
    CUdeviceptr md2 = 0;
    check("a device pointer inside it", cuMemHostGetDevicePointer_v2(&md2, mine + 10, 0), 0);
    expect("offsets carry over", md2 == md + 40);
    check("a kernel on registered memory", inc(md, n, 0), 0);
    check("stream synchronize", cuStreamSynchronize(0), 0);
    good = 1;
    for (unsigned i = 0; i < n; i++) good &= mine[i] == 2 * i + 1;
    expect("the guest's memory holds the kernel's writes", good);
    unsigned tmp[2] = {77, 78};
    check("cuMemcpy into the device pointer", cuMemcpy(md, (CUdeviceptr)(uintptr_t)tmp, 8), 0);
    expect("lands in the guest's memory", mine[0] == 77 && mine[1] == 78);
    check("cuMemHostUnregister", cuMemHostUnregister(mine), 0);
    free(mine);
    size_t f0, t0;
    cuMemGetInfo_v2(&f0, &t0);
    expect("everything is back in the slice", f0 == t0);
}

static void managed(void) {
    const unsigned n = 50000;
    int attr = -1;
    check("MANAGED_MEMORY queried", cuDeviceGetAttribute(&attr, 83, 0), 0);
    expect("managed memory is supported", attr == 1);
    check("CONCURRENT_MANAGED_ACCESS queried", cuDeviceGetAttribute(&attr, 89, 0), 0);
    expect("concurrent managed access is 0", attr == 0);
    size_t f0, t0, f1, t1;
    cuMemGetInfo_v2(&f0, &t0);
    CUdeviceptr p = 0;
    check("cuMemAllocManaged GLOBAL", cuMemAllocManaged(&p, n * 4, 1), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("managed memory is charged to the slice", f0 - f1 >= n * 4);
    unsigned *h = (unsigned *)(uintptr_t)p;
    for (unsigned i = 0; i < n; i++) h[i] = i;
    check("a kernel on managed memory", inc(p, n, 0), 0);
    check("a second kernel before synchronizing", inc(p, n, 0), 0);
    check("synchronize", cuCtxSynchronize(), 0);
    int good = 1;
    for (unsigned i = 0; i < n; i++) good &= h[i] == i + 2;
    expect("the host sees both kernels' writes at the same address", good);
    h[0] = 1000;
    check("launch after a host write", inc(p, 1, 0), 0);
    unsigned v = 0;
    check("cuMemcpyDtoH from managed memory synchronizes", cuMemcpyDtoH_v2(&v, p, 4), 0);
    expect("the kernel saw the host's write", v == 1001 && h[0] == 1001);

    unsigned m = 0, one = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    check("IS_MANAGED", cuPointerGetAttribute(&m, 8, p + 100), 0);
    expect("is managed", m == 1);
    /* IS_MANAGED is an unsigned int: all four bytes are written. */
    unsigned not_managed = 0xdeadbe00u;
    CUdeviceptr plain = 0;
    check("cuMemAlloc for IS_MANAGED", cuMemAlloc_v2(&plain, 64), 0);
    check("IS_MANAGED of device memory", cuPointerGetAttribute(&not_managed, 8, plain), 0);
    expect("device memory is not managed, in all four bytes", not_managed == 0);
    check("cuMemFree", cuMemFree_v2(plain), 0);
    check("RANGE_START_ADDR", cuPointerGetAttribute(&start, 11, p + 100), 0);
    check("RANGE_SIZE", cuPointerGetAttribute(&size, 12, p + 100), 0);
    expect("the range is the allocation", start == p && size == n * 4);
    int attrs[] = {8, 2, 3};
    CUdeviceptr dp = 0;
    void *data[] = {&m, &one, &dp};
    check("cuPointerGetAttributes", cuPointerGetAttributes(3, attrs, data, p), 0);
    expect("managed, device memory, same pointer", m == 1 && one == 2 && dp == p);
    int local = 0;
    check("cuPointerGetAttributes on stack memory", cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)(uintptr_t)&local), 0);
    expect("defaults for host memory", m == 0 && dp == 0);
    check("cuPointerGetAttribute on stack memory", cuPointerGetAttribute(&m, 2, (CUdeviceptr)(uintptr_t)&local), 1);

    check("cuMemAdvise SET_READ_MOSTLY", cuMemAdvise(p, n * 4, 1, 0), 0);
    check("cuMemAdvise SET_PREFERRED_LOCATION cpu", cuMemAdvise(p, n * 4, 3, -1), 0);
    check("cuMemAdvise SET_ACCESSED_BY", cuMemAdvise(p, n * 4, 5, 0), 0);
    check("cuMemAdvise to a missing device", cuMemAdvise(p, n * 4, 3, 7), 101);
    int rm = 0, pl = 0, ab[3] = {0, 0, 0}, lp = 0;
    check("READ_MOSTLY", cuMemRangeGetAttribute(&rm, 4, 1, p, n * 4), 0);
    check("PREFERRED_LOCATION", cuMemRangeGetAttribute(&pl, 4, 2, p, n * 4), 0);
    check("ACCESSED_BY", cuMemRangeGetAttribute(ab, sizeof ab, 3, p, n * 4), 0);
    expect("advice is reported", rm == 1 && pl == -1 && ab[0] == 0 && ab[1] == -2);
    check("cuMemPrefetchAsync to the device", cuMemPrefetchAsync(p, n * 4, 0, 0), 0);
    check("LAST_PREFETCH_LOCATION", cuMemRangeGetAttribute(&lp, 4, 4, p, n * 4), 0);
    expect("prefetched to device 0", lp == 0);
    check("cuMemPrefetchAsync past the end", cuMemPrefetchAsync(p, n * 4 + 1, 0, 0), 1);
    CUdeviceptr ranges[2] = {p, p + 64};
    size_t range_sizes[2] = {64, 64}, loc_idxs[2] = {0, 1};
    CUmemLocation to[2] = {{1, 0}, {2, 0}};
    check("cuMemPrefetchBatchAsync (needs concurrent managed access)",
          cuMemPrefetchBatchAsync(ranges, range_sizes, 2, to, loc_idxs, 2, 0, 0), 801);
    loc_idxs[1] = 2;
    check("... with a location index past the batch",
          cuMemPrefetchBatchAsync(ranges, range_sizes, 2, to, loc_idxs, 2, 0, 0), 1);
    check("cuMemDiscardBatchAsync (needs concurrent managed access)",
          cuMemDiscardBatchAsync(ranges, range_sizes, 2, 0, 0), 801);
    check("... with flags", cuMemDiscardBatchAsync(ranges, range_sizes, 2, 1, 0), 1);
    check("synchronize after prefetch", cuCtxSynchronize(), 0);

    /* Host attach: the host may use it while a stream works on other memory. */
    CUstream s;
    cuStreamCreate(&s, 0);
    CUdeviceptr q = 0;
    check("cuMemAllocManaged HOST", cuMemAllocManaged(&q, 4096, 2), 0);
    check("bad managed flags", cuMemAllocManaged(&q, 4096, 3), 1);
    check("attach to a stream", cuStreamAttachMemAsync(s, p, 0, 4), 0);
    check("a kernel on its stream", inc(p, n, s), 0);
    check("stream synchronize", cuStreamSynchronize(s), 0);
    expect("the stream's kernel ran", h[1] == 4);
    check("attach globally", cuStreamAttachMemAsync(s, p, 0, 1), 0);
    check("cuMemsetD32Async on managed memory", cuMemsetD32Async(p, 5, n, s), 0);
    check("stream synchronize 2", cuStreamSynchronize(s), 0);
    expect("the host sees the memset", all_equal(h, n, 5));
    cuStreamDestroy_v2(s);
    check("cuMemFree of managed memory", cuMemFree_v2(p), 0);
    check("cuMemFree of the host-attached one", cuMemFree_v2(q), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("everything is back in the slice", f1 == f0);
}

static void pools(void) {
    int attr = 0;
    check("MEMORY_POOLS_SUPPORTED queried", cuDeviceGetAttribute(&attr, 115, 0), 0);
    expect("pools are supported", attr == 1);
    size_t f0, t0, f1, t1;
    cuMemGetInfo_v2(&f0, &t0);
    CUmemoryPool def = NULL, cur = NULL;
    check("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool(&def, 0), 0);
    check("cuDeviceGetMemPool", cuDeviceGetMemPool(&cur, 0), 0);
    expect("the current pool is the default pool", def == cur && def != NULL);
    CUstream s;
    cuStreamCreate(&s, 0);
    CUdeviceptr a = 0, b = 0;
    check("cuMemAllocAsync", cuMemAllocAsync(&a, 4 * MIB, s), 0);
    check("cuMemsetD32Async on it", cuMemsetD32Async(a, 7, MIB, s), 0);
    check("a kernel on it", inc(a, MIB, s), 0);
    unsigned v[2];
    check("stream synchronize", cuStreamSynchronize(s), 0);
    check("read back", cuMemcpyDtoH_v2(v, a + 4 * MIB - 8, 8), 0);
    expect("the stream's work ran on pool memory", v[0] == 8 && v[1] == 8);
    unsigned long long reserved = 0, used = 0, high = 0;
    check("RESERVED_MEM_CURRENT", cuMemPoolGetAttribute(def, 5, &reserved), 0);
    check("USED_MEM_CURRENT", cuMemPoolGetAttribute(def, 7, &used), 0);
    expect("4 MiB reserved and used", reserved == 4 * MIB && used == 4 * MIB);
    cuMemGetInfo_v2(&f1, &t1);
    expect("the reservation is charged", f0 - f1 == 4 * MIB);
    CUmemoryPool owner = NULL;
    check("MEMPOOL_HANDLE", cuPointerGetAttribute(&owner, 17, a), 0);
    expect("the block's pool", owner == def);
    /* Free and reuse in stream order. */
    unsigned long long threshold = 64 * MIB;
    check("RELEASE_THRESHOLD set", cuMemPoolSetAttribute(def, 4, &threshold), 0);
    check("cuMemFreeAsync", cuMemFreeAsync(a, s), 0);
    check("cuMemAllocAsync again", cuMemAllocAsync(&b, 4 * MIB, s), 0);
    expect("the freed block is reused", b == a);
    check("cuMemFreeAsync again", cuMemFreeAsync(b, s), 0);
    check("synchronize", cuStreamSynchronize(s), 0);
    check("RESERVED after free", cuMemPoolGetAttribute(def, 5, &reserved), 0);
    check("USED after free", cuMemPoolGetAttribute(def, 7, &used), 0);
    expect("below the threshold the pool keeps its memory", reserved == 4 * MIB && used == 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("reserved memory stays charged", f0 - f1 == 4 * MIB);
    check("cuMemPoolTrimTo 0", cuMemPoolTrimTo(def, 0), 0);
    check("RESERVED after trim", cuMemPoolGetAttribute(def, 5, &reserved), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("trim gives it back", reserved == 0 && f1 == f0);
    check("USED_MEM_HIGH", cuMemPoolGetAttribute(def, 8, &high), 0);
    expect("high-water mark", high == 4 * MIB);
    unsigned long long zero = 0;
    check("reset USED_MEM_HIGH", cuMemPoolSetAttribute(def, 8, &zero), 0);
    check("USED_MEM_HIGH after reset", cuMemPoolGetAttribute(def, 8, &high), 0);
    expect("reset to current", high == 0);
    unsigned long long seven = 7;
    check("setting a high-water mark to non-zero", cuMemPoolSetAttribute(def, 6, &seven), 1);
    int reuse = 0;
    check("REUSE_ALLOW_OPPORTUNISTIC", cuMemPoolGetAttribute(def, 2, &reuse), 0);
    expect("on by default", reuse == 1);
    /* The default threshold (0) releases at synchronization. */
    threshold = 0;
    check("RELEASE_THRESHOLD 0", cuMemPoolSetAttribute(def, 4, &threshold), 0);
    check("alloc", cuMemAllocAsync(&a, MIB, s), 0);
    check("free", cuMemFreeAsync(a, s), 0);
    check("synchronize releases", cuStreamSynchronize(s), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("back in the slice after synchronizing", f1 == f0);

    /* A pool of our own. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    CUmemoryPool mine = NULL;
    check("cuMemPoolCreate", cuMemPoolCreate(&mine, &props), 0);
    check("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&a, 2 * MIB, mine, s), 0);
    check("cuDeviceSetMemPool", cuDeviceSetMemPool(0, mine), 0);
    /* CUDA 13's per-location calls name the same pools. */
    CUmemLocation dev_loc = {1, 0}, host_loc = {2, 0};
    CUmemoryPool p13 = NULL;
    check("cuMemGetMemPool (CUDA 13)", cuMemGetMemPool(&p13, &dev_loc, 1), 0);
    expect("the device's current pool", p13 == mine);
    check("cuMemGetDefaultMemPool (CUDA 13)", cuMemGetDefaultMemPool(&p13, &dev_loc, 1), 0);
    expect("the device's default pool", p13 == def);
    check("cuMemSetMemPool (CUDA 13) back to the default", cuMemSetMemPool(&dev_loc, 1, def), 0);
    check("cuDeviceGetMemPool after it", cuDeviceGetMemPool(&cur, 0), 0);
    expect("it was set", cur == def);
    check("cuMemSetMemPool to ours again", cuMemSetMemPool(&dev_loc, 1, mine), 0);
    check("a host memory pool is not supported", cuMemGetDefaultMemPool(&p13, &host_loc, 1), 801);
    check("a managed memory pool is not supported", cuMemGetMemPool(&p13, &dev_loc, 2), 801);
    check("an unknown allocation type", cuMemGetMemPool(&p13, &dev_loc, 9), 1);
    check("no location", cuMemGetMemPool(&p13, NULL, 1), 1);
    check("cuMemAllocAsync from the current pool", cuMemAllocAsync(&b, MIB, s), 0);
    check("RESERVED of the new pool", cuMemPoolGetAttribute(mine, 5, &reserved), 0);
    expect("both came from it", reserved == 3 * MIB);
    CUmemAccessDesc desc = {{1, 0}, 3};
    check("cuMemPoolSetAccess read-write", cuMemPoolSetAccess(mine, &desc, 1), 0);
    CUmemLocation loc = {1, 0};
    int acc = 0;
    check("cuMemPoolGetAccess", cuMemPoolGetAccess(&acc, mine, &loc), 0);
    expect("read-write", acc == 3);
    char exp[64];
    check("export of a block of a pool without handle types is refused",
          cuMemPoolExportPointer(exp, a), 1);
    props.handleTypes = 2; /* CU_MEM_HANDLE_TYPE_WIN32 */
    CUmemoryPool shareable = NULL;
    check("a pool shared as a Windows handle is refused", cuMemPoolCreate(&shareable, &props), 801);
    props.handleTypes = 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: within the VM */
    check("a pool shared as a file descriptor", cuMemPoolCreate(&shareable, &props), 0);
    check("destroying it", cuMemPoolDestroy(shareable), 0);
    props.handleTypes = 0;
    check("cuMemFree of a pool block", cuMemFree_v2(b), 0);
    check("destroying the default pool is refused", cuMemPoolDestroy(def), 1);
    check("cuMemPoolDestroy with a block in use", cuMemPoolDestroy(mine), 0);
    check("the destroyed pool is gone", cuMemPoolGetAttribute(mine, 5, &reserved), 1);
    check("the current pool is the default again", cuDeviceGetMemPool(&cur, 0), 0);
    expect("default", cur == def);
    check("freeing the last block", cuMemFreeAsync(a, s), 0);
    check("synchronize at the end", cuStreamSynchronize(s), 0);
    check("forged pool", cuMemAllocFromPoolAsync(&a, MIB, (CUmemoryPool)0x123456, s), 1);
    check("huge pool allocation", cuMemAllocAsync(&a, (size_t)1 << 62, s), 2);
    cuStreamDestroy_v2(s);
    cuMemGetInfo_v2(&f1, &t1);
    expect("everything is back in the slice", f1 == f0);
}


static CUmemAllocationProp vmm_prop(int handle_types) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = 1;
    p.requestedHandleTypes = handle_types;
    p.location.type = 1;
    p.location.id = 0;
    return p;
}

static void vmm(void) {
    size_t f0, t0, f1, t1;
    cuMemGetInfo_v2(&f0, &t0);
    int attr = 0;
    check("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", cuDeviceGetAttribute(&attr, 102, 0), 0);
    expect("supported", attr == 1);
    CUmemAllocationProp prop = vmm_prop(1);
    size_t gran = 0;
    check("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity(&gran, &prop, 0), 0);
    expect("2 MiB", gran == 2 * MIB);
    CUmemGenericAllocationHandle a = 0, b = 0;
    check("cuMemCreate a", cuMemCreate(&a, gran, &prop, 0), 0);
    check("cuMemCreate b", cuMemCreate(&b, gran, &prop, 0), 0);
    check("cuMemCreate of a size that is not granular", cuMemCreate(&b, gran + 1, &prop, 0), 1);
    cuMemGetInfo_v2(&f1, &t1);
    expect("physical memory is charged when created, unmapped", f0 - f1 == 2 * gran);
    CUdeviceptr va = 0;
    check("cuMemAddressReserve", cuMemAddressReserve(&va, 4 * gran, 0, 0, 0), 0);
    check("cuMemMap a", cuMemMap(va, gran, 0, a, 0), 0);
    check("cuMemMap b after it", cuMemMap(va + gran, gran, 0, b, 0), 0);
    check("mapping over a mapping", cuMemMap(va, gran, 0, b, 0), 1);
    check("mapping outside the reservation", cuMemMap(va + 4 * gran, gran, 0, b, 0), 1);
    check("copy before access is set", cuMemsetD32_v2(va, 1, 4), 1);
    CUmemAccessDesc rw = {{1, 0}, 3};
    check("cuMemSetAccess", cuMemSetAccess(va, 2 * gran, &rw, 1), 0);
    CUmemLocation dev0 = {1, 0};
    unsigned long long acc = 0;
    check("cuMemGetAccess", cuMemGetAccess(&acc, &dev0, va + gran + 5), 0);
    expect("read-write", acc == 3);
    check("memset a", cuMemsetD32_v2(va, 41, gran / 4), 0);
    check("memset b", cuMemsetD32_v2(va + gran, 99, gran / 4), 0);
    check("a kernel on mapped memory", inc(va, gran / 4, 0), 0);
    unsigned v[2] = {0, 0};
    check("read a", cuMemcpyDtoH_v2(&v[0], va + gran - 4, 4), 0);
    check("read b", cuMemcpyDtoH_v2(&v[1], va + gran, 4), 0);
    expect("the kernel ran on a, b is intact", v[0] == 42 && v[1] == 99);
    /* One range over both mappings: copies, memsets and kernels cross the seam. */
    enum { SEAM = 8192 };
    static unsigned span[2 * SEAM], back[2 * SEAM];
    for (unsigned i = 0; i < 2 * SEAM; i++) span[i] = i * 7u;
    CUdeviceptr seam = va + gran - SEAM * 4;
    check("a copy across two mappings", cuMemcpyHtoD_v2(seam, span, sizeof span), 0);
    check("a kernel across two mappings", inc(seam, 2 * SEAM, 0), 0);
    check("a read across two mappings", cuMemcpyDtoH_v2(back, seam, sizeof back), 0);
    int same = 1;
    for (unsigned i = 0; i < 2 * SEAM; i++) same &= back[i] == i * 7u + 1;
    expect("the data crossed the seam both ways", same);
    check("a memset across two mappings", cuMemsetD32_v2(seam, 5, 2 * SEAM), 0);
    check("read it back", cuMemcpyDtoH_v2(back, seam, sizeof back), 0);
    expect("set on both sides", back[0] == 5 && back[SEAM - 1] == 5 && back[SEAM] == 5 && back[2 * SEAM - 1] == 5);
    check("a device copy across two mappings", cuMemcpyDtoD_v2(va, seam, sizeof back), 0);
    check("read the copy", cuMemcpyDtoH_v2(back, va, sizeof back), 0);
    expect("copied", back[0] == 5 && back[2 * SEAM - 1] == 5);
    check("a copy past the last mapping is refused", cuMemcpyHtoD_v2(va + 2 * gran - 4, span, 8), 1);
    check("cuMemFree of mapped memory is refused", cuMemFree_v2(va), 1);
    CUmemGenericAllocationHandle r = 0;
    check("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + gran + 8)), 0);
    expect("it is b", r == b);
    check("release the retained reference", cuMemRelease(r), 0);
    CUmemAllocationProp got;
    check("cuMemGetAllocationPropertiesFromHandle", cuMemGetAllocationPropertiesFromHandle(&got, a), 0);
    expect("pinned on device 0, fd-exportable", got.type == 1 && got.location.id == 0 && got.requestedHandleTypes == 1);
    int fd = -1;
    check("cuMemExportToShareableHandle fd", cuMemExportToShareableHandle(&fd, a, 1, 0), 0);
    CUmemGenericAllocationHandle imp = 0;
    check("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, 1), 0);
    check("release the import", cuMemRelease(imp), 0);
    close(fd);
    int notours = 0;
    check("importing something else", cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)notours, 1), 1);
    check("cuMemMapArrayAsync is refused", cuMemMapArrayAsync(NULL, 0, 0), 801);
    /* Released while mapped: the memory lives until unmapped. */
    check("cuMemRelease a", cuMemRelease(a), 0);
    check("cuMemRelease b", cuMemRelease(b), 0);
    check("still usable while mapped", cuMemcpyDtoH_v2(&v[0], va, 4), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("still charged while mapped", f0 - f1 == 2 * gran);
    check("freeing a reservation with mappings", cuMemAddressFree(va, 4 * gran), 1);
    check("cuMemUnmap", cuMemUnmap(va, 2 * gran), 0);
    check("cuMemAddressFree", cuMemAddressFree(va, 4 * gran), 0);
    cuMemGetInfo_v2(&f1, &t1);
    expect("everything is back in the slice", f1 == f0);
    check("a huge reservation is refused", cuMemAddressReserve(&va, (size_t)1 << 46, 0, 0, 0), 2);
    check("creating past the slice", cuMemCreate(&a, (t0 / gran + 1) * gran, &prop, 0), 2);
}

static void vmm_export(void) {
    CUmemAllocationProp prop = vmm_prop(8);
    CUmemGenericAllocationHandle a = 0;
    check("cuMemCreate", cuMemCreate(&a, 2 * MIB, &prop, 0), 0);
    unsigned char fabric[64];
    check("export as a fabric handle", cuMemExportToShareableHandle(fabric, a, 8, 0), 0);
    printf("fabric ");
    for (int i = 0; i < 64; i++) printf("%02x", fabric[i]);
    printf("\nholding\n");
    fflush(stdout);
    for (;;) pause();
}

static void vmm_import(const char *hex, int want) {
    unsigned char fabric[64];
    for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", &fabric[i]);
    CUmemGenericAllocationHandle h = 0;
    check("import", cuMemImportFromShareableHandle(&h, fabric, 8), want);
    if (want == 0) check("release", cuMemRelease(h), 0);
}

/* One allocation of KIND; 0 on success. */
static CUresult alloc_kind(const char *kind, size_t bytes, void **out) {
    CUdeviceptr d = 0;
    CUresult r;
    if (!strcmp(kind, "managed")) {
        r = cuMemAllocManaged(&d, bytes, 1);
        *out = (void *)(uintptr_t)d;
    } else if (!strcmp(kind, "mapped")) {
        r = cuMemHostAlloc(out, bytes, 2);
    } else if (!strcmp(kind, "registered")) {
        void *m = aligned_alloc(4096, bytes);
        r = cuMemHostRegister_v2(m, bytes, 2);
        if (r) free(m);
        *out = m;
    } else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = vmm_prop(0);
        CUmemGenericAllocationHandle h = 0;
        r = cuMemCreate(&h, bytes, &prop, 0);
        *out = (void *)(uintptr_t)h;
    } else {
        r = cuMemAllocAsync(&d, bytes, 0);
        *out = (void *)(uintptr_t)d;
    }
    return r;
}

static CUresult free_kind(const char *kind, void *p) {
    if (!strcmp(kind, "managed")) return cuMemFree_v2((CUdeviceptr)(uintptr_t)p);
    if (!strcmp(kind, "mapped")) return cuMemFreeHost(p);
    if (!strcmp(kind, "registered")) {
        CUresult r = cuMemHostUnregister(p);
        free(p);
        return r;
    }
    if (!strcmp(kind, "vmm")) return cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)p);
    return cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, 0);
}

static void fill(const char *kind) {
    size_t f0, t0, f1, t1;
    size_t chunk = strcmp(kind, "vmm") ? MIB : 2 * MIB;
    cuMemGetInfo_v2(&f0, &t0);
    void *ptrs[4096];
    int n = 0;
    CUresult r = 0;
    while (n < 4096 && (r = alloc_kind(kind, chunk, &ptrs[n])) == 0) n++;
    printf("allocated %zu MiB of %s before result %d\n", n * chunk / MIB, kind, r);
    check("allocating past the slice", r, 2);
    expect("the whole slice was usable", (size_t)n * chunk == t0);
    for (int i = 0; i < n; i++)
        if (free_kind(kind, ptrs[i])) failures++;
    if (!strcmp(kind, "pool")) {
        CUmemoryPool def;
        cuDeviceGetDefaultMemPool(&def, 0);
        unsigned long long reserved = 0;
        cuMemPoolGetAttribute(def, 5, &reserved);
        cuMemGetInfo_v2(&f1, &t1);
        expect("freed blocks stay reserved until trimmed", reserved == t0 && f1 == 0);
        check("trim", cuMemPoolTrimTo(def, 0), 0);
    }
    cuMemGetInfo_v2(&f1, &t1);
    expect("freeing gives the slice back", f1 == t1);
    check("allocating again", alloc_kind(kind, chunk, &ptrs[0]), 0);
}

static void hold(const char *kind, size_t bytes) {
    void *p;
    check("hold", alloc_kind(kind, bytes, &p), 0);
    printf("holding\n");
    fflush(stdout);
    for (;;) pause();
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Moves of managed memory carry only the pages that changed: scattered host writes and kernels
 * on a few elements leave every element right, and cost pages, not the buffer. */
static void delta(void) {
    const unsigned n = 4u * MIB + 77; /* 16 MiB and a partial page */
    CUdeviceptr q = 0;
    check("cuMemAllocManaged 16 MiB", cuMemAllocManaged(&q, (size_t)n * 4, 1), 0);
    unsigned *g = (unsigned *)(uintptr_t)q;
    for (unsigned i = 0; i < n; i++) g[i] = i;
    check("first launch", inc(q, 1, 0), 0);
    check("first synchronize", cuCtxSynchronize(), 0);
    unsigned rounds = 8, touched[3] = {5, n / 2, n - 1};
    for (unsigned r = 0; r < rounds; r++) {
        for (unsigned t = 0; t < 3; t++) g[touched[t]] += 10;
        /* A kernel on one element in the last, partial page. */
        inc(q + (size_t)(n - 2) * 4, 1, 0);
        cuCtxSynchronize();
    }
    int good = 1;
    for (unsigned i = 0; i < n; i++) {
        unsigned want = i;
        if (i == 0) want += 1;
        if (i == 5 || i == n / 2 || i == n - 1) want += 10 * rounds;
        if (i == n - 2) want += rounds;
        good &= g[i] == want;
    }
    expect("every element is right after page-sized moves", good);
    check("cuMemFree", cuMemFree_v2(q), 0);
    printf("delta: %u rounds over %u MiB\n", rounds, (unsigned)((size_t)n * 4 / MIB));
}

static void bench(size_t mib) {
    size_t bytes = mib * MIB;
    CUdeviceptr p = 0, d = 0;
    check("device", cuMemAlloc_v2(&d, bytes), 0);
    unsigned *buf = malloc(bytes);
    memset(buf, 1, bytes);
    const int iters = 8;
    /* One tiny kernel, so that the kernel itself does not hide the mirror's cost. */
    double t0 = now();
    for (int i = 0; i < iters; i++) {
        inc(d, 1, 0);
        cuCtxSynchronize();
    }
    double plain = (now() - t0) / iters;
    t0 = now();
    for (int i = 0; i < iters; i++) {
        cuMemcpyHtoD_v2(d, buf, bytes);
        cuMemcpyDtoH_v2(buf, d, bytes);
    }
    double copies = (now() - t0) / iters;
    check("managed", cuMemAllocManaged(&p, bytes, 1), 0);
    unsigned *h = (unsigned *)(uintptr_t)p;
    t0 = now();
    for (int i = 0; i < iters; i++) {
        h[0] = i;
        inc(p, 1, 0);
        cuCtxSynchronize();
    }
    double managed = (now() - t0) / iters;
    expect("the last kernel's write is visible", h[0] == (unsigned)iters);
    printf("bench managed %zu MiB: launch+sync %.2f ms with the managed buffer, %.2f ms without; "
           "an explicit HtoD+DtoH of the same size %.2f ms\n",
           mib, managed * 1e3, plain * 1e3, copies * 1e3);
    free(buf);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: alloc_api mapped|managed|pools|fill KIND|hold KIND BYTES|bench MIB\n");
        return 2;
    }
    setup();
    if (!strcmp(argv[1], "mapped")) mapped();
    else if (!strcmp(argv[1], "managed")) managed();
    else if (!strcmp(argv[1], "pools")) pools();
    else if (!strcmp(argv[1], "vmm")) vmm();
    else if (!strcmp(argv[1], "vmm-export")) vmm_export();
    else if (!strcmp(argv[1], "vmm-import") && argc > 3) vmm_import(argv[2], atoi(argv[3]));
    else if (!strcmp(argv[1], "fill") && argc > 2) fill(argv[2]);
    else if (!strcmp(argv[1], "hold") && argc > 3) hold(argv[2], strtoull(argv[3], NULL, 0));
    else if (!strcmp(argv[1], "bench") && argc > 2) bench(strtoull(argv[2], NULL, 0));
    else if (!strcmp(argv[1], "delta")) delta();
    else return 2;
    return failures;
}
