/*
 * Stream memory operations as a C program calls them through cuda.h: cuStreamWaitValue32/64,
 * cuStreamWriteValue32/64 (the CUDA 8 names and CUDA 11.7's _v2, the per-thread form and
 * cuGetProcAddress), cuStreamBatchMemOp, and batch memory-operation graph nodes (captured,
 * added explicitly and through cuGraphAddNode, with their parameter calls).
 *
 * A wait must hold its stream until another stream's write, a kernel's store or the host's
 * copy meets it; each condition is checked on 32 and 64 bits; refusals carry CUDA's codes;
 * cuCtxDestroy does not wait for a word nobody writes.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;

typedef union {
    unsigned operation;
    struct {
        unsigned operation;
        CUdeviceptr address;
        union {
            unsigned value;
            unsigned long long value64;
        };
        unsigned flags;
        CUdeviceptr alias;
    } waitValue, writeValue;
    struct {
        unsigned operation;
        unsigned flags;
    } flushRemoteWrites, memoryBarrier;
    unsigned long long pad[6];
} CUstreamBatchMemOpParams;

typedef struct {
    CUcontext ctx;
    unsigned count;
    CUstreamBatchMemOpParams *paramArray;
    unsigned flags;
} CUDA_BATCH_MEM_OP_NODE_PARAMS;

typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_BATCH_MEM_OP_NODE_PARAMS memOp;
    };
    long long reserved2;
} CUgraphNodeParams;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

CUresult cuStreamWriteValue32(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWriteValue64(CUstream, CUdeviceptr, unsigned long long, unsigned);
CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWaitValue64(CUstream, CUdeviceptr, unsigned long long, unsigned);
CUresult cuStreamWriteValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWriteValue64_v2(CUstream, CUdeviceptr, unsigned long long, unsigned);
CUresult cuStreamWaitValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWaitValue64_v2(CUstream, CUdeviceptr, unsigned long long, unsigned);
CUresult cuStreamWriteValue32_v2_ptsz(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamBatchMemOp_v2(CUstream, unsigned, CUstreamBatchMemOpParams *, unsigned);

CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphNodeGetType(CUgraphNode, int *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphAddBatchMemOpNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                  const CUDA_BATCH_MEM_OP_NODE_PARAMS *);
CUresult cuGraphBatchMemOpNodeGetParams(CUgraphNode, CUDA_BATCH_MEM_OP_NODE_PARAMS *);
CUresult cuGraphBatchMemOpNodeSetParams(CUgraphNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS *);
CUresult cuGraphExecBatchMemOpNodeSetParams(CUgraphExec, CUgraphNode,
                                            const CUDA_BATCH_MEM_OP_NODE_PARAMS *);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);

enum { WAIT32 = 1, WRITE32 = 2, FLUSH_REMOTE = 3, WAIT64 = 4, WRITE64 = 5, BARRIER = 6 };
enum { GEQ = 0, EQ = 1, AND = 2, NOR = 3 };
#define WAIT_FLUSH (1u << 30)
#define NOT_READY 600
#define INVALID_VALUE 1
#define NOT_SUPPORTED 801
#define NON_BLOCKING 1u
#define STREAM_PER_THREAD ((CUstream)2)
#define BATCH_MEM_OP_NODE 12

static const char FLAG_PTX[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry set_flag(.param .u64 flag, .param .u32 value)\n"
    "{\n"
    "  .reg .b32 %r<2>; .reg .b64 %rd<2>;\n"
    "  ld.param.u64 %rd1, [flag]; ld.param.u32 %r1, [value];\n"
    "  st.volatile.global.u32 [%rd1], %r1;\n"
    "  ret;\n"
    "}\n";

#include "check.h"

static void pause_ms(int ms) {
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

/* Whether `s` still waits after a pause in which a released wait would have let it go. */
static int held(CUstream s) {
    pause_ms(50);
    return cuStreamQuery(s) == NOT_READY;
}

/* Whether `s` finishes within 20 s (a loaded machine). */
static int released(CUstream s) {
    for (int i = 0; i < 20000; i++) {
        CUresult r = cuStreamQuery(s);
        if (r == 0) return 1;
        if (r != NOT_READY) return 0;
        pause_ms(1);
    }
    return 0;
}

static unsigned read32(CUdeviceptr p) {
    unsigned v = 0xffffffffu;
    cuMemcpyDtoH_v2(&v, p, 4);
    return v;
}

static unsigned long long read64(CUdeviceptr p) {
    unsigned long long v = 0;
    cuMemcpyDtoH_v2(&v, p, 8);
    return v;
}

static CUstreamBatchMemOpParams value_op(unsigned op, CUdeviceptr addr, unsigned long long v,
                                         unsigned flags) {
    CUstreamBatchMemOpParams p;
    memset(&p, 0, sizeof p);
    p.operation = op;
    p.writeValue.address = addr;
    if (op == WAIT32 || op == WRITE32) {
        p.writeValue.value = (unsigned)v;
    } else {
        p.writeValue.value64 = v;
    }
    p.writeValue.flags = flags;
    return p;
}

static void attributes(CUdevice dev) {
    int v = -1;
    const struct { int attr, want; const char *what; } want[] = {
        {92, 1, "CAN_USE_STREAM_MEM_OPS_V1"},
        {93, 1, "CAN_USE_64_BIT_STREAM_MEM_OPS_V1"},
        {94, 1, "CAN_USE_STREAM_WAIT_VALUE_NOR_V1"},
        {122, 1, "CAN_USE_64_BIT_STREAM_MEM_OPS"},
        {123, 1, "CAN_USE_STREAM_WAIT_VALUE_NOR"},
        {98, 0, "CAN_FLUSH_REMOTE_WRITES"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cuDeviceGetAttribute(&v, want[i].attr, dev);
        expect(want[i].what, v == want[i].want);
    }
}

static void waits_and_writes(CUdeviceptr words, CUstream s1, CUstream s2) {
    CUdeviceptr flag = words, marker = words + 64, wide = words + 128;

    check("cuStreamWaitValue32_v2 (EQ 1)", cuStreamWaitValue32_v2(s1, flag, 1, EQ), 0);
    cuMemsetD32Async(marker, 5, 1, s1);
    expect("the wait holds its stream", held(s1));
    expect("nothing after the wait ran", read32(marker) == 0);
    check("cuStreamWriteValue32_v2 on another stream", cuStreamWriteValue32_v2(s2, flag, 1, 0), 0);
    expect("the write released the wait", released(s1));
    expect("... and the work after it ran", read32(marker) == 5);

    CUmodule m;
    CUfunction set_flag;
    check("cuModuleLoadData", cuModuleLoadData(&m, FLAG_PTX), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&set_flag, m, "set_flag"), 0);
    check("cuStreamWaitValue32 (GEQ 7, the CUDA 8 name)", cuStreamWaitValue32(s1, flag, 7, GEQ), 0);
    cuMemsetD32Async(marker, 6, 1, s1);
    expect("1 is not >= 7", held(s1));
    unsigned nine = 9;
    void *args[] = {&flag, &nine};
    check("a kernel stores 9", cuLaunchKernel(set_flag, 1, 1, 1, 1, 1, 1, 0, s2, args, NULL), 0);
    expect("the kernel's store released the wait", released(s1) && read32(marker) == 6);

    check("cuStreamWaitValue32_v2 (EQ 42)", cuStreamWaitValue32_v2(s1, flag, 42, EQ), 0);
    cuMemsetD32Async(marker, 7, 1, s1);
    expect("9 is not 42", held(s1));
    unsigned v42 = 42;
    check("the host copies 42", cuMemcpyHtoD_v2(flag, &v42, 4), 0);
    expect("the host's copy released the wait", released(s1) && read32(marker) == 7);

    check("cuStreamWriteValue64", cuStreamWriteValue64(s2, wide, 0x100000000ull, 0), 0);
    cuStreamSynchronize(s2);
    expect("the 64-bit write landed", read64(wide) == 0x100000000ull);
    const struct {
        const char *what;
        int wide;
        unsigned flags;
        unsigned long long value;
        int met;
        unsigned long long meet; /* a word that meets it, when it is not met at once */
    } conds[] = {
        {"64-bit EQ", 1, EQ, 0x100000000ull, 1, 0},
        {"64-bit AND", 1, AND, 0x300000000ull, 1, 0},
        {"64-bit NOR", 1, NOR, 0xffffull, 1, 0},
        {"32-bit GEQ is cyclic", 0, GEQ, 0xfffffff0ull, 1, 0},
        {"32-bit EQ reads the low half", 0, EQ, 0, 1, 0},
        {"64-bit GEQ", 1, GEQ, 0x100000001ull, 0, 0x200000000ull},
        {"32-bit AND", 0, AND, 0xffffffffull, 0, 0x100000001ull},
        {"64-bit NOR", 1, NOR, ~0x100000000ull, 0, 0},
    };
    for (size_t i = 0; i < sizeof conds / sizeof conds[0]; i++) {
        CUresult r = conds[i].wide ? cuStreamWaitValue64(s1, wide, conds[i].value, conds[i].flags)
                                   : cuStreamWaitValue32_v2(s1, wide, (unsigned)conds[i].value,
                                                            conds[i].flags);
        check(conds[i].what, r, 0);
        if (conds[i].met) {
            expect("... is met at once", released(s1));
        } else {
            expect("... holds", held(s1));
            cuStreamWriteValue64_v2(s2, wide, conds[i].meet, 0);
            expect("... until a write meets it", released(s1));
            cuStreamWriteValue64_v2(s2, wide, 0x100000000ull, 0);
            cuStreamSynchronize(s2);
        }
    }
    check("the context synchronizes", cuCtxSynchronize(), 0);
}

static void batches(CUdeviceptr words, CUstream s1) {
    CUdeviceptr a = words + 256, b = words + 264;
    CUstreamBatchMemOpParams ops[4];
    ops[0] = value_op(WRITE32, a, 3, 0);
    memset(&ops[1], 0, sizeof ops[1]);
    ops[1].memoryBarrier.operation = BARRIER;
    ops[1].memoryBarrier.flags = 1; /* CU_STREAM_MEMORY_BARRIER_TYPE_GPU */
    ops[2] = value_op(WAIT32, a, 3, EQ);
    ops[3] = value_op(WRITE64, b, 0x123456789abcull, 0);
    check("cuStreamBatchMemOp_v2 of a write, a barrier, a wait and a 64-bit write",
          cuStreamBatchMemOp_v2(s1, 4, ops, 0), 0);
    expect("the batch ran in order", released(s1) && read32(a) == 3 && read64(b) == 0x123456789abcull);

    CUstreamBatchMemOpParams bad = value_op(WRITE64, words + 4, 1, 0);
    check("a misaligned 64-bit write", cuStreamBatchMemOp_v2(s1, 1, &bad, 0), INVALID_VALUE);
    bad = value_op(WRITE32, a, 1, 2);
    check("unknown write flags", cuStreamBatchMemOp_v2(s1, 1, &bad, 0), INVALID_VALUE);
    bad = value_op(WAIT32, a, 1, 4);
    check("an unknown wait condition", cuStreamBatchMemOp_v2(s1, 1, &bad, 0), INVALID_VALUE);
    bad.operation = 7;
    check("an unknown operation", cuStreamBatchMemOp_v2(s1, 1, &bad, 0), INVALID_VALUE);
    check("batch flags", cuStreamBatchMemOp_v2(s1, 1, ops, 1), INVALID_VALUE);
    check("a NULL array", cuStreamBatchMemOp_v2(s1, 1, NULL, 0), INVALID_VALUE);
    static CUstreamBatchMemOpParams many[256];
    for (int i = 0; i < 256; i++) many[i] = value_op(WRITE32, a, 4, 0);
    check("256 operations", cuStreamBatchMemOp_v2(s1, 256, many, 0), INVALID_VALUE);
    memset(&bad, 0, sizeof bad);
    bad.flushRemoteWrites.operation = FLUSH_REMOTE;
    check("flushing remote writes", cuStreamBatchMemOp_v2(s1, 1, &bad, 0), NOT_SUPPORTED);
    check("a wait that flushes", cuStreamWaitValue32_v2(s1, a, 3, EQ | WAIT_FLUSH), NOT_SUPPORTED);
    unsigned host_word = 0;
    check("a host address", cuStreamWriteValue32_v2(s1, (CUdeviceptr)(uintptr_t)&host_word, 1, 0),
          INVALID_VALUE);
    /* A batch with one bad operation queues none of them. */
    CUstreamBatchMemOpParams mixed[2] = {value_op(WRITE32, a, 99, 0), value_op(WRITE64, words + 4, 1, 0)};
    check("a batch with a bad operation", cuStreamBatchMemOp_v2(s1, 2, mixed, 0), INVALID_VALUE);
    cuStreamSynchronize(s1);
    expect("... queued none of them", read32(a) == 3);
    check("the stream is still fine", cuStreamSynchronize(s1), 0);
}

/* Managed and mapped memory take part as in a launch: what the host wrote before the call is on
 * the device, and the host sees the device's writes after a synchronization. */
static void mirrored_memory(CUstream s1) {
    CUdeviceptr m;
    check("cuMemAllocManaged", cuMemAllocManaged(&m, 4096, 1 /* CU_MEM_ATTACH_GLOBAL */), 0);
    volatile unsigned *mw = (volatile unsigned *)(uintptr_t)m;
    mw[0] = 5;
    mw[1] = 0;
    check("a wait on managed memory the host wrote", cuStreamWaitValue32_v2(s1, m, 5, EQ), 0);
    check("a write to managed memory", cuStreamWriteValue32_v2(s1, m + 4, 6, 0), 0);
    check("... synchronized", cuStreamSynchronize(s1), 0);
    expect("the host sees the device's write to managed memory", mw[1] == 6);
    cuMemFree_v2(m);

    void *host = NULL;
    check("cuMemHostAlloc DEVICEMAP", cuMemHostAlloc(&host, 4096, 2 /* CU_MEMHOSTALLOC_DEVICEMAP */), 0);
    CUdeviceptr d = 0;
    cuMemHostGetDevicePointer_v2(&d, host, 0);
    volatile unsigned *hw = host;
    hw[0] = 8;
    hw[1] = 0;
    check("a wait on mapped memory the host wrote", cuStreamWaitValue32_v2(s1, d, 8, GEQ), 0);
    check("a 64-bit write to mapped memory", cuStreamWriteValue64_v2(s1, d + 8, 0x900000009ull, 0), 0);
    check("... synchronized", cuStreamSynchronize(s1), 0);
    expect("the host sees the device's write to mapped memory",
           ((volatile unsigned long long *)host)[1] == 0x900000009ull);
    cuMemFreeHost(host);
}

static void entry_points(CUdeviceptr words) {
    void *fn = NULL;
    int status = -1;
    check("cuGetProcAddress cuStreamWaitValue32 for CUDA 12.0",
          cuGetProcAddress_v2("cuStreamWaitValue32", &fn, 12000, 0, &status), 0);
    expect("... is the _v2 entry point", fn == (void *)cuStreamWaitValue32_v2);
    check("cuGetProcAddress cuStreamWaitValue32 for CUDA 11.0",
          cuGetProcAddress_v2("cuStreamWaitValue32", &fn, 11000, 0, &status), 0);
    expect("... is the CUDA 8 entry point", fn == (void *)cuStreamWaitValue32);
    check("cuGetProcAddress cuGraphAddBatchMemOpNode",
          cuGetProcAddress_v2("cuGraphAddBatchMemOpNode", &fn, 12000, 0, &status), 0);
    check("cuStreamWriteValue32_v2_ptsz", cuStreamWriteValue32_v2_ptsz(NULL, words + 512, 77, 0), 0);
    check("the per-thread default stream", cuStreamSynchronize(STREAM_PER_THREAD), 0);
    expect("... wrote", read32(words + 512) == 77);
}

static void graphs(CUdeviceptr words, CUstream s) {
    CUdeviceptr flag = words + 1024, marker = words + 1088, x = words + 1152, y = words + 1160,
                z = words + 1168;
    cuMemsetD32_v2(words + 1024, 0, 64);

    /* Captured operations become batch memory-operation nodes. */
    CUgraph g;
    check("cuStreamBeginCapture", cuStreamBeginCapture_v2(s, 0), 0);
    check("a captured write", cuStreamWriteValue32_v2(s, flag, 0x55, 0), 0);
    check("a captured wait", cuStreamWaitValue32_v2(s, flag, 0x55, EQ), 0);
    cuMemsetD32Async(marker, 8, 1, s);
    check("cuStreamEndCapture", cuStreamEndCapture(s, &g), 0);
    expect("nothing ran while capturing", read32(flag) == 0);
    CUgraphNode nodes[8];
    size_t n = 8;
    cuGraphGetNodes(g, nodes, &n);
    int mem_op_nodes = 0;
    for (size_t i = 0; i < n; i++) {
        int ty = -1;
        cuGraphNodeGetType(nodes[i], &ty);
        mem_op_nodes += ty == BATCH_MEM_OP_NODE;
    }
    expect("the capture made two batch memory-operation nodes and a memset", n == 3 && mem_op_nodes == 2);
    CUgraphExec e;
    check("cuGraphInstantiate of the capture", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("cuGraphLaunch", cuGraphLaunch(e, s), 0);
    expect("the captured write released the captured wait", released(s) && read32(marker) == 8 &&
                                                           read32(flag) == 0x55);
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);

    /* Nodes added explicitly, and their parameters. */
    check("cuGraphCreate", cuGraphCreate(&g, 0), 0);
    CUstreamBatchMemOpParams ops[2] = {value_op(WRITE32, x, 1, 0), value_op(WRITE64, y, 2, 0)};
    CUDA_BATCH_MEM_OP_NODE_PARAMS p = {NULL, 2, ops, 0};
    CUgraphNode first, second;
    check("cuGraphAddBatchMemOpNode", cuGraphAddBatchMemOpNode(&first, g, NULL, 0, &p), 0);
    int ty = -1;
    cuGraphNodeGetType(first, &ty);
    expect("... is a batch memory-operation node", ty == BATCH_MEM_OP_NODE);
    CUDA_BATCH_MEM_OP_NODE_PARAMS got;
    memset(&got, 0, sizeof got);
    check("cuGraphBatchMemOpNodeGetParams", cuGraphBatchMemOpNodeGetParams(first, &got), 0);
    expect("... gives the operations back",
           got.count == 2 && got.paramArray && got.paramArray[1].writeValue.value64 == 2 &&
               got.paramArray[0].writeValue.address == x);
    ops[0].writeValue.value = 11;
    ops[1].writeValue.value64 = 22;
    check("cuGraphBatchMemOpNodeSetParams", cuGraphBatchMemOpNodeSetParams(first, &p), 0);
    /* A wait on the first node's write, then a write: through the generic call. */
    CUstreamBatchMemOpParams gen[2] = {value_op(WAIT32, x, 11, EQ), value_op(WRITE32, z, 33, 0)};
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = BATCH_MEM_OP_NODE;
    np.memOp.count = 2;
    np.memOp.paramArray = gen;
    check("cuGraphAddNode of a batch memory-operation node", cuGraphAddNode(&second, g, &first, 1, &np), 0);
    CUDA_BATCH_MEM_OP_NODE_PARAMS none = {NULL, 0, ops, 0};
    CUgraphNode unused;
    check("a node of no operations", cuGraphAddBatchMemOpNode(&unused, g, NULL, 0, &none), INVALID_VALUE);
    check("cuGraphInstantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("cuGraphLaunch", cuGraphLaunch(e, s), 0);
    expect("the nodes wrote the values set", released(s) && read32(x) == 11 && read64(y) == 22 &&
                                                 read32(z) == 33);
    ops[0].writeValue.value = 111;
    ops[1].writeValue.value64 = 222;
    gen[0].waitValue.value = 111;
    gen[1].writeValue.value = 333;
    check("cuGraphExecBatchMemOpNodeSetParams", cuGraphExecBatchMemOpNodeSetParams(e, first, &p), 0);
    np.memOp.paramArray = gen;
    check("... on the generic node", cuGraphExecBatchMemOpNodeSetParams(e, second, &np.memOp), 0);
    check("cuGraphLaunch again", cuGraphLaunch(e, s), 0);
    expect("the launch used the new values", released(s) && read32(x) == 111 && read64(y) == 222 &&
                                                  read32(z) == 333);
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
}

static void stuck_context(CUcontext main_ctx, CUdevice dev) {
    CUcontext other;
    check("a second context", cuCtxCreate_v2(&other, 0, dev), 0);
    CUdeviceptr w;
    cuMemAlloc_v2(&w, 4096);
    cuMemsetD32_v2(w, 0, 1);
    CUstream s;
    cuStreamCreate(&s, NON_BLOCKING);
    check("a wait nobody will meet", cuStreamWaitValue32_v2(s, w, 1, EQ), 0);
    expect("... holds", held(s));
    time_t t0 = time(NULL);
    check("cuCtxDestroy with the wait pending", cuCtxDestroy_v2(other), 0);
    expect("... did not wait for it", time(NULL) - t0 < 20);
    cuCtxSetCurrent(main_ctx);
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    check("cuInit", cuInit(0), 0);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    attributes(dev);
    CUdeviceptr words;
    check("cuMemAlloc", cuMemAlloc_v2(&words, 4096), 0);
    cuMemsetD32_v2(words, 0, 1024);
    CUstream s1, s2;
    cuStreamCreate(&s1, NON_BLOCKING);
    cuStreamCreate(&s2, NON_BLOCKING);
    waits_and_writes(words, s1, s2);
    batches(words, s1);
    mirrored_memory(s1);
    entry_points(words);
    graphs(words, s1);
    stuck_context(ctx, dev);
    check("cuCtxSynchronize at the end", cuCtxSynchronize(), 0);
    cuStreamDestroy_v2(s1);
    cuStreamDestroy_v2(s2);
    cuMemFree_v2(words);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    printf("# stream_mem_ops: %d failed\n", failures);
    return failures;
}
