/*
 * Kernels on page-locked host memory at its host address, as CUDA allows on a unified-addressing
 * device whether or not the buffer was allocated with CU_MEMHOSTALLOC_DEVICEMAP: cuMemAllocHost
 * and cuMemHostAlloc buffers (small, huge-page sized, portable) handed to a kernel by their host
 * pointer are read and written by it; the host sees the kernel's writes after synchronizing and
 * the kernel sees the host's writes at the next launch. Device memory is taken from the slice
 * only once a kernel uses a buffer, and given back when it is freed. Kernels also reach buffers
 * through pointers the program stored in device memory (a struct, a table).
 *
 *   pinned_kernels
 *
 * Prints "ok <what>" or "FAIL <what>"; the exit status is the number of failures.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);
CUresult cuMemFreeHost(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned int);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphDestroy(CUgraph);

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_HOST 1
#define BLOCK 128
#define MIB (1u << 20)

/* p[i] += 1 for i < n. */
static const char PTX[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %q;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %q, %r5, %r1;\n"
    "  @%q bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r7, %r6, 1;\n"
    "  st.global.u32 [%rd4], %r7;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n"
    /* The same on the buffer whose address is stored at pp (in device memory). */
    ".visible .entry add_one_at(.param .u64 pp, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %q;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd5, [pp];\n"
    "  cvta.to.global.u64 %rd5, %rd5;\n"
    "  ld.global.u64 %rd1, [%rd5];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %q, %r5, %r1;\n"
    "  @%q bra DONE2;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r7, %r6, 1;\n"
    "  st.global.u32 [%rd4], %r7;\n"
    "DONE2:\n"
    "  ret;\n"
    "}\n";

static CUfunction add_one, add_one_at;

static size_t free_bytes(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f;
}

static CUresult launch_on(CUstream s, unsigned *p, unsigned n) {
    void *args[] = {&p, &n};
    return cuLaunchKernel(add_one, (n + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, s, args, 0);
}

static CUresult launch(unsigned *p, unsigned n) { return launch_on(0, p, n); }

static int all(const unsigned *p, unsigned n, unsigned mul, unsigned add) {
    for (unsigned i = 0; i < n; i++)
        if (p[i] != i * mul + add) {
            printf("  [%u] = %u, want %u\n", i, p[i], i * mul + add);
            return 0;
        }
    return 1;
}

/* A buffer of n words, allocated by `how`: kernels read and write it at its host address. */
static void buffer(const char *how, unsigned n, unsigned flags) {
    char what[160];
    unsigned *p = NULL;
    size_t before = free_bytes();
    CUresult r = !strcmp(how, "cuMemAllocHost") ? cuMemAllocHost_v2((void **)&p, n * 4)
                                                : cuMemHostAlloc((void **)&p, n * 4, flags);
    snprintf(what, sizeof what, "%s of %u bytes (flags %u)", how, n * 4, flags);
    check(what, r, 0);
    if (!p) return;
    expect("... takes no device memory before a kernel uses it", free_bytes() == before);
    unsigned type = 0;
    check("... is host memory", cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                      (CUdeviceptr)p), 0);
    expect("... of type host", type == CU_MEMORYTYPE_HOST);
    CUdeviceptr dp = 0;
    /* CUDA's rule: only DEVICEMAP memory has a device pointer to ask for (kernels use the host
     * pointer itself). */
    check("cuMemHostGetDevicePointer without DEVICEMAP", cuMemHostGetDevicePointer_v2(&dp, p, 0),
          1);
    for (unsigned i = 0; i < n; i++) p[i] = i;
    check("a kernel on it, by its host pointer", launch(p, n), 0);
    check("cuCtxSynchronize", cuCtxSynchronize(), 0);
    expect("the host sees the kernel's writes", all(p, n, 1, 1));
    expect("device memory was taken for it", free_bytes() < before);
    check("still no device pointer to ask for", cuMemHostGetDevicePointer_v2(&dp, p, 0), 1);
    for (unsigned i = 0; i < n; i++) p[i] = 2 * i;
    check("a second kernel", launch(p, n), 0);
    check("cuCtxSynchronize", cuCtxSynchronize(), 0);
    expect("the kernel saw the host's writes", all(p, n, 2, 1));
    /* Copies between it and device memory still work, in both directions. */
    CUdeviceptr d;
    check("cuMemAlloc", cuMemAlloc_v2(&d, n * 4), 0);
    check("cuMemcpyHtoD from it", cuMemcpyHtoD_v2(d, p, n * 4), 0);
    memset(p, 0, n * 4);
    check("cuMemcpyDtoH into it", cuMemcpyDtoH_v2(p, d, n * 4), 0);
    expect("the copies round-trip", all(p, n, 2, 1));
    check("a kernel after the copy", launch(p, n), 0);
    check("cuCtxSynchronize", cuCtxSynchronize(), 0);
    expect("the kernel saw the copied data", all(p, n, 2, 2));
    check("cuMemFree", cuMemFree_v2(d), 0);
    check("cuMemFreeHost", cuMemFreeHost(p), 0);
    expect("its device memory went back with it", free_bytes() == before);
}

int main(void) {
    CUcontext ctx;
    CUmodule mod;
    check("cuInit", cuInit(0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, 0), 0);
    check("cuModuleLoadData", cuModuleLoadData(&mod, PTX), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&add_one, mod, "add_one"), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&add_one_at, mod, "add_one_at"), 0);
    buffer("cuMemAllocHost", 1000, 0);
    buffer("cuMemHostAlloc", 3 * MIB / 4, 0);
    buffer("cuMemHostAlloc", 4096, CU_MEMHOSTALLOC_PORTABLE);
    /* A kernel node of a graph, on a buffer no direct launch used. */
    unsigned n = 5000, *g = NULL;
    CUstream s;
    CUgraph graph;
    CUgraphExec exec;
    check("a buffer for a graph", cuMemAllocHost_v2((void **)&g, n * 4), 0);
    for (unsigned i = 0; i < n; i++) g[i] = 3 * i;
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("cuStreamBeginCapture", cuStreamBeginCapture_v2(s, 0), 0);
    check("a captured kernel on it", launch_on(s, g, n), 0);
    check("cuStreamEndCapture", cuStreamEndCapture(s, &graph), 0);
    check("cuGraphInstantiate", cuGraphInstantiateWithFlags(&exec, graph, 0), 0);
    check("cuGraphLaunch", cuGraphLaunch(exec, s), 0);
    check("cuGraphLaunch again", cuGraphLaunch(exec, s), 0);
    check("cuStreamSynchronize", cuStreamSynchronize(s), 0);
    expect("the graph's kernel ran on it twice", all(g, n, 3, 2));
    cuGraphExecDestroy(exec);
    cuGraphDestroy(graph);
    cuStreamDestroy_v2(s);
    check("... freed", cuMemFreeHost(g), 0);
    /* Buffers a kernel finds only through pointers stored in device memory: a struct whose
     * second field is the buffer's address, and a table of two buffers' addresses. */
    {
        unsigned m = 300, *a = NULL, *b = NULL;
        check("a buffer reached through a struct", cuMemAllocHost_v2((void **)&a, m * 4), 0);
        check("a buffer reached through a table", cuMemAllocHost_v2((void **)&b, m * 4), 0);
        for (unsigned i = 0; i < m; i++) a[i] = b[i] = 5 * i;
        struct {
            unsigned long long n;
            unsigned *p;
        } st = {m, a};
        unsigned *table[2] = {b, a};
        CUdeviceptr dst, dtab;
        check("the struct's device memory", cuMemAlloc_v2(&dst, sizeof st), 0);
        check("the table's device memory", cuMemAlloc_v2(&dtab, sizeof table), 0);
        check("the struct copied to the device", cuMemcpyHtoD_v2(dst, &st, sizeof st), 0);
        check("the table copied to the device", cuMemcpyHtoD_v2(dtab, table, sizeof table), 0);
        CUdeviceptr at_struct = dst + 8, at_table = dtab;
        void *args1[] = {&at_struct, &m};
        void *args2[] = {&at_table, &m};
        check("a kernel on the struct's pointer",
              cuLaunchKernel(add_one_at, (m + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, 0, args1, 0),
              0);
        check("a kernel on the table's first pointer",
              cuLaunchKernel(add_one_at, (m + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, 0, args2, 0),
              0);
        check("cuCtxSynchronize", cuCtxSynchronize(), 0);
        expect("the kernels wrote both buffers", all(a, m, 5, 1) && all(b, m, 5, 1));
        check("cuMemFree (struct)", cuMemFree_v2(dst), 0);
        check("cuMemFree (table)", cuMemFree_v2(dtab), 0);
        check("... freed", cuMemFreeHost(a), 0);
        check("... freed", cuMemFreeHost(b), 0);
    }
    /* One that never meets a kernel costs nothing and frees cleanly. */
    size_t before = free_bytes();
    void *idle = NULL;
    check("a buffer no kernel uses", cuMemAllocHost_v2(&idle, MIB), 0);
    check("... freed", cuMemFreeHost(idle), 0);
    expect("... never took device memory", free_bytes() == before);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    printf("%s\n", failures ? "FAILED" : "PASS");
    return failures;
}
