/*
 * Stream capture and CUDA graphs through vgpu's libcuda.so, called from C the
 * way cuda.h declares them:
 *
 *   graphs MODE SAXPY_PTX [ARG]
 *
 * capture   a copy/memset/kernel/copy sequence captured and replayed with new host data
 * fork      cross-stream capture through events (fork and join), and an unjoined fork
 * errors    CUDA's errors for illegal calls during capture, per capture mode
 * explicit  graphs built node by node: dependencies, queries, host and child nodes,
 *           dot output, clone
 * update    cuGraphExecUpdate and cuGraphExec*NodeSetParams taking effect
 * mem SLICE graph allocation nodes charged to the slice and refused past it
 * generic   the generic node API (cuGraphAddNode(_v2), cuGraphNodeSetParams,
 *           cuGraphExecNodeSetParams): every provided node type, parameter changes, an
 *           allocation node charged to the slice, refused types
 * branches  a graph's independent branches run at the same time: a kernel of one spins until a
 *           kernel of the other sets its flag (built node by node, with a child graph, and by
 *           capture); run against a watchdog, a replay in one order fails with 702
 * userobjects  user objects and graphs' references on them: the destructor runs once the
 *           last reference of the program, a graph, its clone and an executable graph is gone
 * bench N   prints the time per kernel of N launches and of a graph of N kernels
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is
 * the number of failures.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS;

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
} CUDA_MEMSET_NODE_PARAMS;

typedef struct {
    void (*fn)(void *);
    void *userData;
} CUDA_HOST_NODE_PARAMS;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    unsigned int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    unsigned int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

typedef struct {
    unsigned char poolProps[88];
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

enum { HOST = 1, DEVICE = 2 };
enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
enum { NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_GRAPH = 4 };
enum { NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11 };

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventQuery(CUevent);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuStreamGetCaptureInfo_v2(CUstream, int *, unsigned long long *, CUgraph *,
                                   const CUgraphNode **, size_t *);
CUresult cuThreadExchangeStreamCaptureMode(int *);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphDestroy(CUgraph);
/* CUDA 13.1's graph IDs. */
CUresult cuGraphGetId(CUgraph, unsigned int *);
CUresult cuGraphExecGetId(CUgraphExec, unsigned int *);
CUresult cuGraphNodeGetContainingGraph(CUgraphNode, CUgraph *);
CUresult cuGraphNodeGetLocalId(CUgraphNode, unsigned int *);
CUresult cuGraphNodeGetToolsId(CUgraphNode, unsigned long long *);
CUresult cuGraphClone(CUgraph *, CUgraph);
CUresult cuGraphNodeFindInClone(CUgraphNode *, CUgraphNode, CUgraph);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphGetRootNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphGetEdges(CUgraph, CUgraphNode *, CUgraphNode *, size_t *);
CUresult cuGraphNodeGetType(CUgraphNode, int *);
CUresult cuGraphNodeGetDependencies(CUgraphNode, CUgraphNode *, size_t *);
CUresult cuGraphNodeGetDependentNodes(CUgraphNode, CUgraphNode *, size_t *);
CUresult cuGraphAddDependencies(CUgraph, const CUgraphNode *, const CUgraphNode *, size_t);
CUresult cuGraphRemoveDependencies(CUgraph, const CUgraphNode *, const CUgraphNode *, size_t);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphKernelNodeGetParams(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphKernelNodeSetParams(CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphAddMemsetNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
CUresult cuGraphAddMemcpyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_MEMCPY3D *, CUcontext);
CUresult cuGraphAddHostNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                            const CUDA_HOST_NODE_PARAMS *);
CUresult cuGraphAddEmptyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphDebugDotPrint(CUgraph, const char *, unsigned int);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphNodeSetEnabled(CUgraphExec, CUgraphNode, unsigned int);
CUresult cuGraphNodeGetEnabled(CUgraphExec, CUgraphNode, unsigned int *);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *, int *);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec, CUgraphNode, const CUDA_MEMSET_NODE_PARAMS *,
                                        CUcontext);
typedef union {
    char pad[64];
    int priority;
    int cooperative;
} CUkernelNodeAttrValue;
enum { ATTR_COOPERATIVE = 2, ATTR_PRIORITY = 8 };
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode, int, const CUkernelNodeAttrValue *);
CUresult cuGraphKernelNodeGetAttribute(CUgraphNode, int, CUkernelNodeAttrValue *);

/*
 * The generic node API of CUDA 12.2+ (cuGraphAddNode, cuGraphNodeSetParams,
 * cuGraphExecNodeSetParams). The nvcc 11.8 cuda.h other C tests build against lacks these
 * types, so they are declared here as CUDA 12.x's cuda.h lays them out (the shim asserts the
 * same sizes and offsets); a build with a CUDA 12.2+ cuda.h would take its definitions.
 */
#if !defined(CUDA_VERSION) || CUDA_VERSION < 12020
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v3;

typedef struct {
    int flags;
    int reserved;
    CUcontext copyCtx;
    CUDA_MEMCPY3D copyParams;
} CUDA_MEMCPY_NODE_PARAMS;

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
    CUcontext ctx;
} CUDA_MEMSET_NODE_PARAMS_v2;

typedef struct {
    CUgraph graph;
    int ownership;
} CUDA_CHILD_GRAPH_NODE_PARAMS;

typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v3 kernel;
        CUDA_MEMCPY_NODE_PARAMS memcpy;
        CUDA_MEMSET_NODE_PARAMS_v2 memset;
        CUDA_HOST_NODE_PARAMS host; /* CUDA_HOST_NODE_PARAMS_v2: the same fields */
        CUDA_CHILD_GRAPH_NODE_PARAMS graph;
        struct { CUevent event; } eventWait;
        struct { CUevent event; } eventRecord;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* CUDA_MEM_ALLOC_NODE_PARAMS_v2: the same fields */
        struct { CUdeviceptr dptr; } free;
    };
    long long reserved2;
} CUgraphNodeParams;

typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} CUgraphEdgeData;

CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuGraphAddNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                           size_t, CUgraphNodeParams *);
CUresult cuGraphNodeSetParams(CUgraphNode, CUgraphNodeParams *);
CUresult cuGraphNodeGetParams(CUgraphNode, CUgraphNodeParams *);
CUresult cuGraphDestroyNode(CUgraphNode);
CUresult cuGraphExecNodeSetParams(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
#endif
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is 256 bytes");
enum { NODE_EMPTY = 5, NODE_WAIT_EVENT = 6, NODE_EVENT_RECORD = 7, NODE_EXT_SEMAS_SIGNAL = 8 };
enum { NODE_EXT_SEMAS_WAIT = 9, NODE_BATCH_MEM_OP = 12, NODE_CONDITIONAL = 13 };



typedef struct CUuserObject_st *CUuserObject;
CUresult cuUserObjectCreate(CUuserObject *, void *, void (*)(void *), unsigned int, unsigned int);
CUresult cuUserObjectRetain(CUuserObject, unsigned int);
CUresult cuUserObjectRelease(CUuserObject, unsigned int);
CUresult cuGraphRetainUserObject(CUgraph, CUuserObject, unsigned int, unsigned int);
CUresult cuGraphReleaseUserObject(CUgraph, CUuserObject, unsigned int);
CUresult cuGraphClone(CUgraph *, CUgraph);

CUresult cuDeviceGetGraphMemAttribute(CUdevice, int, void *);
CUresult cuDeviceSetGraphMemAttribute(CUdevice, int, void *);

#define N 4096
#define BYTES (N * sizeof(float))
#define ONE 0x3f800000u /* 1.0f */
#define TWO 0x40000000u /* 2.0f */

static CUcontext ctx;
static CUfunction saxpy;

static void setup(const char *ptx_path) {
    CUdevice dev;
    CUmodule mod;
    check("cuInit", cuInit(0), 0);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    FILE *f = fopen(ptx_path, "rb");
    if (!f) {
        printf("FAIL cannot open %s\n", ptx_path);
        exit(1);
    }
    static char ptx[1 << 20];
    size_t n = fread(ptx, 1, sizeof ptx - 1, f);
    fclose(f);
    ptx[n] = 0;
    check("load saxpy", cuModuleLoadData(&mod, ptx), 0);
    check("get saxpy", cuModuleGetFunction(&saxpy, mod, "saxpy"), 0);
}

/* y = a*x + y over N floats. */
static CUresult launch_saxpy(CUstream s, float a, CUdeviceptr x, CUdeviceptr y) {
    int n = N;
    void *args[] = {&n, &a, &x, &y};
    return cuLaunchKernel(saxpy, N / 128, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

/* Kernel node parameters for saxpy; the argument storage is static per slot. */
static CUDA_KERNEL_NODE_PARAMS saxpy_params(int slot, float a, CUdeviceptr x, CUdeviceptr y) {
    static int n[8];
    static float as[8];
    static CUdeviceptr xs[8], ys[8];
    static void *args[8][4];
    n[slot] = N;
    as[slot] = a;
    xs[slot] = x;
    ys[slot] = y;
    args[slot][0] = &n[slot];
    args[slot][1] = &as[slot];
    args[slot][2] = &xs[slot];
    args[slot][3] = &ys[slot];
    CUDA_KERNEL_NODE_PARAMS p = {saxpy, N / 128, 1, 1, 128, 1, 1, 0, args[slot], NULL};
    return p;
}

/* Whether every y[i] == c + k * x[i]. */
static int all_equal(const float *y, const float *x, float c, float k) {
    for (int i = 0; i < N; i++) {
        if (y[i] != c + k * x[i]) {
            printf("  [%d] = %g, want %g\n", i, y[i], c + k * x[i]);
            return 0;
        }
    }
    return 1;
}

static void read_back(float *h, CUdeviceptr d) {
    check("read back", cuMemcpyDtoH_v2(h, d, BYTES), 0);
}

static size_t node_count(CUgraph g) {
    size_t n = 0;
    cuGraphGetNodes(g, NULL, &n);
    return n;
}

static void mode_capture(void) {
    static float hx[N], hz[N], x0[N];
    CUdeviceptr x, y, z;
    CUstream s;
    CUgraph g = NULL, g2 = NULL;
    CUgraphExec e;
    int status = -1;
    unsigned long long id = 0;
    check("alloc x", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc y", cuMemAlloc_v2(&y, BYTES), 0);
    check("alloc z", cuMemAlloc_v2(&z, BYTES), 0);
    check("zero z", cuMemsetD32_v2(z, 0, N), 0);
    check("stream", cuStreamCreate(&s, 1), 0);

    check("begin capture", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("is capturing", cuStreamIsCapturing(s, &status), 0);
    expect("status is active", status == 1);
    check("capture info", cuStreamGetCaptureInfo_v2(s, &status, &id, &g2, NULL, NULL), 0);
    expect("capture info names a graph", status == 1 && id != 0 && g2 != NULL);
    check("captured HtoD", cuMemcpyHtoDAsync_v2(x, hx, BYTES, s), 0);
    check("captured memset", cuMemsetD32Async(y, ONE, N, s), 0);
    check("captured kernel 1", launch_saxpy(s, 1.0f, x, y), 0);
    check("captured kernel 2", launch_saxpy(s, 2.0f, x, y), 0);
    check("captured kernel 3", launch_saxpy(s, 3.0f, x, y), 0);
    check("captured DtoD", cuMemcpyDtoDAsync_v2(z, y, BYTES, s), 0);
    check("captured DtoH", cuMemcpyDtoHAsync_v2(hz, z, BYTES, s), 0);
    check("end capture", cuStreamEndCapture(s, &g), 0);
    expect("the graph is the one capture info named", g == g2);
    check("not capturing any more", cuStreamIsCapturing(s, &status), 0);
    expect("status is none", status == 0);

    /* Capturing ran nothing. */
    read_back(x0, z);
    expect("capture did not run the work", x0[0] == 0.0f && x0[N - 1] == 0.0f);

    expect("7 nodes", node_count(g) == 7);
    CUgraphNode nodes[7];
    size_t n = 7;
    check("get nodes", cuGraphGetNodes(g, nodes, &n), 0);
    int want[7] = {NODE_MEMCPY, NODE_MEMSET, NODE_KERNEL, NODE_KERNEL, NODE_KERNEL, NODE_MEMCPY,
                   NODE_MEMCPY};
    int types_ok = 1;
    for (int i = 0; i < 7; i++) {
        int t = -1;
        cuGraphNodeGetType(nodes[i], &t);
        types_ok &= t == want[i];
    }
    expect("node types in capture order", types_ok);
    size_t edges = 0;
    check("edge count", cuGraphGetEdges(g, NULL, NULL, &edges), 0);
    expect("a chain of 6 edges", edges == 6);
    CUDA_KERNEL_NODE_PARAMS kp;
    check("kernel node params", cuGraphKernelNodeGetParams(nodes[3], &kp), 0);
    expect("captured kernel parameters", kp.func == saxpy && kp.gridDimX == N / 128 &&
                                             kp.blockDimX == 128 &&
                                             *(float *)kp.kernelParams[1] == 2.0f);

    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("upload", cuGraphUpload(e, s), 0);
    int replay_ok = 1;
    for (int rep = 0; rep < 5; rep++) {
        for (int i = 0; i < N; i++) hx[i] = (float)((i % 97) * (rep + 1));
        memset(hz, 0, sizeof hz);
        CUresult r = cuGraphLaunch(e, s);
        CUresult r2 = cuStreamSynchronize(s);
        if (r != 0 || r2 != 0) printf("  launch %d: %d %d\n", rep, r, r2);
        replay_ok &= r == 0 && r2 == 0 && all_equal(hz, hx, 1.0f, 6.0f);
    }
    expect("5 replays with new host data compute y = 1 + 6x", replay_ok);
    /* The graph on the legacy stream, twice back to back. */
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 13);
    check("launch on the default stream", cuGraphLaunch(e, NULL), 0);
    check("launch again", cuGraphLaunch(e, NULL), 0);
    check("synchronize", cuCtxSynchronize(), 0);
    expect("default-stream replays", all_equal(hz, hx, 1.0f, 6.0f));
    /* A graph launched on a capturing stream becomes a child graph node. */
    CUstream s2;
    CUgraph outer = NULL;
    CUgraphExec eo;
    check("stream 2", cuStreamCreate(&s2, 1), 0);
    check("begin capture of a graph launch", cuStreamBeginCapture_v2(s2, MODE_GLOBAL), 0);
    check("captured graph launch", cuGraphLaunch(e, s2), 0);
    check("end", cuStreamEndCapture(s2, &outer), 0);
    CUgraphNode child = NULL;
    size_t one = 1;
    int ct = -1;
    check("outer nodes", cuGraphGetNodes(outer, &child, &one), 0);
    cuGraphNodeGetType(child, &ct);
    expect("one child graph node", one == 1 && ct == NODE_GRAPH);
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 7);
    check("instantiate outer", cuGraphInstantiateWithFlags(&eo, outer, 0), 0);
    check("launch outer", cuGraphLaunch(eo, s2), 0);
    check("sync", cuStreamSynchronize(s2), 0);
    expect("the child graph ran", all_equal(hz, hx, 1.0f, 6.0f));
    check("destroy outer exec", cuGraphExecDestroy(eo), 0);
    check("destroy outer", cuGraphDestroy(outer), 0);
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("launch of a destroyed exec", cuGraphLaunch(e, s), 1);
    check("graph destroy", cuGraphDestroy(g), 0);
    check("stream destroy", cuStreamDestroy_v2(s), 0);
}

/* wait_flag(flag, out): spins until *flag != 0, then *out = *flag + 1; set_flag(flag, v). */
static const char FLAG_PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry wait_flag(.param .u64 flag, .param .u64 out)\n{\n"
    ".reg .pred %p<2>;\n.reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n"
    "ld.param.u64 %rd1, [flag];\nld.param.u64 %rd2, [out];\n"
    "$Lspin:\nld.volatile.global.u32 %r1, [%rd1];\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 bra $Lspin;\n"
    "add.u32 %r2, %r1, 1;\nst.global.u32 [%rd2], %r2;\nret;\n}\n"
    ".visible .entry set_flag(.param .u64 flag, .param .u32 value)\n{\n"
    ".reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n"
    "ld.param.u64 %rd1, [flag];\nld.param.u32 %r1, [value];\n"
    "st.volatile.global.u32 [%rd1], %r1;\nret;\n}\n";

static unsigned read_u32(CUdeviceptr p) {
    unsigned v = 0;
    cuMemcpyDtoH_v2(&v, p, sizeof v);
    return v;
}

static void mode_branches(void) {
    CUmodule mod;
    CUfunction wait_flag, set_flag;
    CUdeviceptr flag, out, done;
    CUstream s1, s2;
    CUevent fork, join;
    CUgraph g, child, cap;
    CUgraphExec e;
    check("load flag kernels", cuModuleLoadData(&mod, FLAG_PTX), 0);
    check("wait_flag", cuModuleGetFunction(&wait_flag, mod, "wait_flag"), 0);
    check("set_flag", cuModuleGetFunction(&set_flag, mod, "set_flag"), 0);
    check("alloc", cuMemAlloc_v2(&flag, 4), 0);
    check("alloc", cuMemAlloc_v2(&out, 4), 0);
    check("alloc", cuMemAlloc_v2(&done, 4), 0);
    check("stream", cuStreamCreate(&s1, 1), 0);
    check("stream", cuStreamCreate(&s2, 1), 0);
    unsigned five = 5;
    void *wait_args[] = {&flag, &out};
    void *set_args[] = {&flag, &five};
    CUDA_KERNEL_NODE_PARAMS wp = {wait_flag, 1, 1, 1, 1, 1, 1, 0, wait_args, NULL};
    CUDA_KERNEL_NODE_PARAMS sp = {set_flag, 1, 1, 1, 1, 1, 1, 0, set_args, NULL};
    CUDA_MEMSET_NODE_PARAMS zero = {flag, 0, 0, 4, 1, 1};
    CUDA_MEMSET_NODE_PARAMS mark = {done, 0, 1, 4, 1, 1};

    /* flag = 0 -> {wait_flag, set_flag} -> empty join -> done = 1 */
    CUgraphNode m, w, st, j, last;
    check("graph", cuGraphCreate(&g, 0), 0);
    check("memset root", cuGraphAddMemsetNode(&m, g, NULL, 0, &zero, ctx), 0);
    check("wait_flag node", cuGraphAddKernelNode(&w, g, &m, 1, &wp), 0);
    check("set_flag node", cuGraphAddKernelNode(&st, g, &m, 1, &sp), 0);
    CUgraphNode both[] = {w, st};
    check("join", cuGraphAddEmptyNode(&j, g, both, 2), 0);
    check("after the join", cuGraphAddMemsetNode(&last, g, &j, 1, &mark, ctx), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    for (int rep = 0; rep < 2; rep++) {
        check("clear", cuMemsetD32_v2(done, 0, 1), 0);
        check("launch", cuGraphLaunch(e, s1), 0);
        check("branches ran at the same time", cuStreamSynchronize(s1), 0);
        expect("wait_flag saw the flag", read_u32(out) == 6);
        expect("the node after the join ran", read_u32(done) == 1);
    }
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(g), 0);

    /* The two branches inside a child graph, between two nodes of the parent. */
    check("child", cuGraphCreate(&child, 0), 0);
    check("child wait_flag", cuGraphAddKernelNode(&w, child, NULL, 0, &wp), 0);
    check("child set_flag", cuGraphAddKernelNode(&st, child, NULL, 0, &sp), 0);
    check("parent", cuGraphCreate(&g, 0), 0);
    check("memset root", cuGraphAddMemsetNode(&m, g, NULL, 0, &zero, ctx), 0);
    check("child node", cuGraphAddChildGraphNode(&j, g, &m, 1, child), 0);
    check("after the child", cuGraphAddMemsetNode(&last, g, &j, 1, &mark, ctx), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("clear", cuMemsetD32_v2(done, 0, 1), 0);
    check("launch", cuGraphLaunch(e, s1), 0);
    check("a child graph's branches ran at the same time", cuStreamSynchronize(s1), 0);
    expect("after the child graph", read_u32(done) == 1 && read_u32(out) == 6);
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(g), 0);
    check("child destroy", cuGraphDestroy(child), 0);

    /* Captured: s1 forks to s2 through an event and joins back. */
    check("event", cuEventCreate(&fork, 2), 0);
    check("event", cuEventCreate(&join, 2), 0);
    check("begin", cuStreamBeginCapture_v2(s1, MODE_GLOBAL), 0);
    check("s1: flag = 0", cuMemsetD32Async(flag, 0, 1, s1), 0);
    check("fork", cuEventRecord(fork, s1), 0);
    check("s2 waits", cuStreamWaitEvent(s2, fork, 0), 0);
    check("s1: wait_flag", cuLaunchKernel(wait_flag, 1, 1, 1, 1, 1, 1, 0, s1, wait_args, NULL), 0);
    check("s2: set_flag", cuLaunchKernel(set_flag, 1, 1, 1, 1, 1, 1, 0, s2, set_args, NULL), 0);
    check("join", cuEventRecord(join, s2), 0);
    check("s1 waits", cuStreamWaitEvent(s1, join, 0), 0);
    check("s1: done = 1", cuMemsetD32Async(done, 1, 1, s1), 0);
    check("end", cuStreamEndCapture(s1, &cap), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, cap, 0), 0);
    check("clear", cuMemsetD32_v2(done, 0, 1), 0);
    check("launch", cuGraphLaunch(e, s1), 0);
    check("captured branches ran at the same time", cuStreamSynchronize(s1), 0);
    expect("after the captured join", read_u32(done) == 1 && read_u32(out) == 6);
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(cap), 0);

    /* cuGraphNodeSetEnabled: flag = 0 -> [done = 1] -> empty; the memset disabled, then again. */
    unsigned on = 7;
    check("graph", cuGraphCreate(&g, 0), 0);
    check("memset root", cuGraphAddMemsetNode(&m, g, NULL, 0, &zero, ctx), 0);
    check("memset done", cuGraphAddMemsetNode(&last, g, &m, 1, &mark, ctx), 0);
    check("empty", cuGraphAddEmptyNode(&j, g, &last, 1), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("enabled at first", cuGraphNodeGetEnabled(e, last, &on), 0);
    expect("reported enabled", on == 1);
    check("disable", cuGraphNodeSetEnabled(e, last, 0), 0);
    check("get", cuGraphNodeGetEnabled(e, last, &on), 0);
    expect("reported disabled", on == 0);
    check("an empty node cannot be disabled", cuGraphNodeSetEnabled(e, j, 0), 1);
    check("clear", cuMemsetD32_v2(done, 0, 1), 0);
    check("set flag", cuMemsetD32_v2(flag, 9, 1), 0);
    check("launch with the node disabled", cuGraphLaunch(e, s1), 0);
    check("sync", cuStreamSynchronize(s1), 0);
    expect("the disabled node did not run, the others did", read_u32(done) == 0 && read_u32(flag) == 0);
    check("enable", cuGraphNodeSetEnabled(e, last, 1), 0);
    check("launch with the node enabled", cuGraphLaunch(e, s1), 0);
    check("sync", cuStreamSynchronize(s1), 0);
    expect("the enabled node ran", read_u32(done) == 1);
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(g), 0);
}

/* hostcopy: host node -> HtoD memcpy node -> kernel -> DtoH memcpy node -> host node. The copies
 * run when the stream reaches them, in the graph's order: the HtoD node copies what the host node
 * wrote in the same launch, the last host node reads what the DtoH node copied. */
#define HC_REPS 4
static unsigned hc_in, hc_out, hc_seen[HC_REPS];
static int hc_writes, hc_reads;
static pthread_mutex_t hc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hc_cv = PTHREAD_COND_INITIALIZER;
static int hc_returned, hc_released_first;
static CUfunction hc_set_flag;
static CUdeviceptr hc_flag;
static CUstream hc_other;

static void hc_write(void *arg) {
    (void)arg;
    hc_in = 100 + (unsigned)hc_writes++;
}

static void hc_read(void *arg) {
    (void)arg;
    if (hc_reads < HC_REPS) hc_seen[hc_reads] = hc_out;
    hc_reads++;
}

/* Sets the flag once the main thread says cuGraphLaunch returned, or after 20 s if it never does
 * (then the launch waited for the spinning kernel: recorded as a failure, not a hang). */
static void *hc_releaser(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&hc_lock);
    while (!hc_returned) {
        if (pthread_cond_timedwait(&hc_cv, &hc_lock, &until) != 0) break;
    }
    hc_released_first = !hc_returned;
    pthread_mutex_unlock(&hc_lock);
    unsigned one = 1;
    void *args[] = {&hc_flag, &one};
    cuLaunchKernel(hc_set_flag, 1, 1, 1, 1, 1, 1, 0, hc_other, args, NULL);
    cuStreamSynchronize(hc_other);
    return NULL;
}

static void mode_hostcopy(void) {
    CUmodule mod;
    CUfunction wait_flag;
    CUdeviceptr a, b, out;
    CUstream s;
    CUgraph g;
    CUgraphExec e;
    CUgraphNode write, htod, k, dtoh, read;
    check("load flag kernels", cuModuleLoadData(&mod, FLAG_PTX), 0);
    check("wait_flag", cuModuleGetFunction(&wait_flag, mod, "wait_flag"), 0);
    check("set_flag", cuModuleGetFunction(&hc_set_flag, mod, "set_flag"), 0);
    check("alloc", cuMemAlloc_v2(&a, 4), 0);
    check("alloc", cuMemAlloc_v2(&b, 4), 0);
    check("alloc", cuMemAlloc_v2(&out, 4), 0);
    check("alloc", cuMemAlloc_v2(&hc_flag, 4), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    check("stream", cuStreamCreate(&hc_other, 1), 0);

    check("graph", cuGraphCreate(&g, 0), 0);
    CUDA_HOST_NODE_PARAMS wp = {hc_write, NULL};
    check("host node writes hc_in", cuGraphAddHostNode(&write, g, NULL, 0, &wp), 0);
    CUDA_MEMCPY3D c = {0};
    c.srcMemoryType = HOST;
    c.srcHost = &hc_in;
    c.dstMemoryType = DEVICE;
    c.dstDevice = a;
    c.WidthInBytes = 4;
    c.Height = 1;
    c.Depth = 1;
    check("memcpy node hc_in -> a", cuGraphAddMemcpyNode(&htod, g, &write, 1, &c, ctx), 0);
    /* a -> b on the device: the copied value takes a kernel's place between the two copies. */
    check("memcpy node a -> b",
          cuGraphAddMemcpyNode(&k, g, &htod, 1,
                               &(CUDA_MEMCPY3D){.srcMemoryType = DEVICE, .srcDevice = a,
                                                .dstMemoryType = DEVICE, .dstDevice = b,
                                                .WidthInBytes = 4, .Height = 1, .Depth = 1},
                               ctx),
          0);
    CUDA_MEMCPY3D d = {0};
    d.srcMemoryType = DEVICE;
    d.srcDevice = b;
    d.dstMemoryType = HOST;
    d.dstHost = &hc_out;
    d.WidthInBytes = 4;
    d.Height = 1;
    d.Depth = 1;
    check("memcpy node b -> hc_out", cuGraphAddMemcpyNode(&dtoh, g, &k, 1, &d, ctx), 0);
    CUDA_HOST_NODE_PARAMS rp = {hc_read, NULL};
    check("host node reads hc_out", cuGraphAddHostNode(&read, g, &dtoh, 1, &rp), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);

    for (int rep = 0; rep < HC_REPS; rep++) check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("every host node ran once per launch", hc_writes == HC_REPS && hc_reads == HC_REPS);
    for (int rep = 0; rep < HC_REPS; rep++) {
        printf("launch %d: host node wrote %u, the host node after the DtoH node read %u\n", rep,
               100 + rep, hc_seen[rep]);
        expect("the HtoD node copied that launch's host write, the DtoH node was seen",
               hc_seen[rep] == 100u + (unsigned)rep);
    }
    expect("the device holds the last launch's value", read_u32(b) == 100u + HC_REPS - 1);

    /* The launch returns while the stream's earlier kernel spins: its host copies wait on the
     * stream, not in cuGraphLaunch. */
    check("flag = 0", cuMemsetD32_v2(hc_flag, 0, 1), 0);
    void *args[] = {&hc_flag, &out};
    check("spin on the flag", cuLaunchKernel(wait_flag, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), 0);
    pthread_t t;
    pthread_create(&t, NULL, hc_releaser, NULL);
    check("launch behind a spinning kernel", cuGraphLaunch(e, s), 0);
    int writes_then = hc_writes;
    pthread_mutex_lock(&hc_lock);
    hc_returned = 1;
    pthread_cond_signal(&hc_cv);
    pthread_mutex_unlock(&hc_lock);
    pthread_join(t, NULL);
    expect("cuGraphLaunch returned before the spinning kernel was released", !hc_released_first);
    expect("the host node waited for the kernel", writes_then == HC_REPS);
    check("sync", cuStreamSynchronize(s), 0);
    expect("the kernel saw the flag", read_u32(out) == 2);
    expect("the launch behind the kernel copied its own write",
           hc_reads == HC_REPS + 1 && hc_out == 100u + HC_REPS && read_u32(b) == 100u + HC_REPS);

    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(g), 0);
    check("stream destroy", cuStreamDestroy_v2(s), 0);
    check("stream destroy", cuStreamDestroy_v2(hc_other), 0);
}

static void mode_fork(void) {
    static float ha[N], hx[N];
    CUdeviceptr x, a, b;
    CUstream s1, s2;
    CUevent fork, join;
    CUgraph g = NULL;
    CUgraphExec e;
    int status = -1;
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 31);
    check("alloc", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&a, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&b, BYTES), 0);
    check("x", cuMemcpyHtoD_v2(x, hx, BYTES), 0);
    check("stream 1", cuStreamCreate(&s1, 1), 0);
    check("stream 2", cuStreamCreate(&s2, 1), 0);
    check("event", cuEventCreate(&fork, 2), 0);
    check("event", cuEventCreate(&join, 2), 0);

    check("begin", cuStreamBeginCapture_v2(s1, MODE_GLOBAL), 0);
    check("s1: a = 1", cuMemsetD32Async(a, ONE, N, s1), 0);
    check("fork: record", cuEventRecord(fork, s1), 0);
    check("captured event cannot be queried", cuEventQuery(fork), 907);
    check("fork: s2 waits", cuStreamWaitEvent(s2, fork, 0), 0);
    check("s2 capturing", cuStreamIsCapturing(s2, &status), 0);
    expect("s2 joined the capture", status == 1);
    check("s2: b = 2", cuMemsetD32Async(b, TWO, N, s2), 0);
    check("s1: a += 2x", launch_saxpy(s1, 2.0f, x, a), 0);
    check("s2: b += 3x", launch_saxpy(s2, 3.0f, x, b), 0);
    check("end on the joined stream", cuStreamEndCapture(s2, &g), 903);
    /* 903 invalidated the capture: start again. */
    check("end the invalidated capture", cuStreamEndCapture(s1, &g), 901);

    check("begin again", cuStreamBeginCapture_v2(s1, MODE_GLOBAL), 0);
    check("s1: a = 1", cuMemsetD32Async(a, ONE, N, s1), 0);
    check("fork", cuEventRecord(fork, s1), 0);
    check("s2 waits", cuStreamWaitEvent(s2, fork, 0), 0);
    check("s2: b = 2", cuMemsetD32Async(b, TWO, N, s2), 0);
    check("s1: a += 2x", launch_saxpy(s1, 2.0f, x, a), 0);
    check("s2: b += 3x", launch_saxpy(s2, 3.0f, x, b), 0);
    check("join: record on s2", cuEventRecord(join, s2), 0);
    check("join: s1 waits", cuStreamWaitEvent(s1, join, 0), 0);
    check("s1: a += b", launch_saxpy(s1, 1.0f, b, a), 0);
    check("end", cuStreamEndCapture(s1, &g), 0);
    check("s2 no longer capturing", cuStreamIsCapturing(s2, &status), 0);
    expect("s2 status none", status == 0);
    expect("5 nodes", node_count(g) == 5);
    size_t roots = 0, edges = 0;
    check("roots", cuGraphGetRootNodes(g, NULL, &roots), 0);
    check("edges", cuGraphGetEdges(g, NULL, NULL, &edges), 0);
    expect("one root, five edges (fork and join)", roots == 1 && edges == 5);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    for (int rep = 0; rep < 3; rep++) {
        check("launch", cuGraphLaunch(e, s1), 0);
    }
    check("sync", cuStreamSynchronize(s1), 0);
    read_back(ha, a);
    expect("a = (1 + 2x) + (2 + 3x)", all_equal(ha, hx, 3.0f, 5.0f));
    check("exec destroy", cuGraphExecDestroy(e), 0);
    check("graph destroy", cuGraphDestroy(g), 0);

    /* A fork never joined back. */
    check("begin", cuStreamBeginCapture_v2(s1, MODE_GLOBAL), 0);
    check("memset", cuMemsetD32Async(a, ONE, N, s1), 0);
    check("fork", cuEventRecord(fork, s1), 0);
    check("s2 waits", cuStreamWaitEvent(s2, fork, 0), 0);
    check("s2 work", cuMemsetD32Async(b, ONE, N, s2), 0);
    check("end with an unjoined fork", cuStreamEndCapture(s1, &g), 904);
    check("s2 released", cuStreamIsCapturing(s2, &status), 0);
    expect("s2 not capturing", status == 0);
    check("s2 works normally again", cuMemsetD32Async(b, TWO, N, s2), 0);
    check("sync s2", cuStreamSynchronize(s2), 0);
}

static CUstream thread_stream;
static CUresult thread_result;

static void *alloc_in_thread(void *arg) {
    (void)arg;
    CUdeviceptr p = 0;
    cuCtxSetCurrent(ctx);
    thread_result = cuMemAlloc_v2(&p, 4096);
    if (thread_result == 0) cuMemFree_v2(p);
    return NULL;
}

static void *end_in_thread(void *arg) {
    CUgraph g = NULL;
    (void)arg;
    cuCtxSetCurrent(ctx);
    thread_result = cuStreamEndCapture(thread_stream, &g);
    if (thread_result == 0) cuGraphDestroy(g);
    return NULL;
}

static CUresult in_thread(void *(*f)(void *)) {
    pthread_t t;
    pthread_create(&t, NULL, f, NULL);
    pthread_join(t, NULL);
    return thread_result;
}

static void mode_errors(void) {
    CUdeviceptr d = 0, p = 0;
    CUstream s, blocking, other;
    CUevent ev;
    CUgraph g = NULL;
    int status = -1, mode;
    check("alloc", cuMemAlloc_v2(&d, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    check("blocking stream", cuStreamCreate(&blocking, 0), 0);
    check("other stream", cuStreamCreate(&other, 1), 0);
    check("event", cuEventCreate(&ev, 0), 0);

    check("the legacy stream cannot capture", cuStreamBeginCapture_v2(NULL, MODE_GLOBAL), 900);
    check("end without a capture", cuStreamEndCapture(s, &g), 401);
    check("bad mode", cuStreamBeginCapture_v2(s, 7), 1);

    /* Global mode: cuMemAlloc is unsafe; the capture is invalidated. */
    check("begin global", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("begin twice", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 401);
    check("cuMemAlloc during global capture", cuMemAlloc_v2(&p, 4096), 900);
    check("capture info", cuStreamIsCapturing(s, &status), 0);
    expect("status invalidated", status == 2);
    check("work on an invalidated capture", cuMemsetD32Async(d, 0, N, s), 901);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);

    /* Synchronizing a capturing stream. */
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("memset", cuMemsetD32Async(d, 0, N, s), 0);
    check("cuStreamSynchronize of a capturing stream", cuStreamSynchronize(s), 900);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);

    /* cuCtxSynchronize and a synchronous copy are unsafe during a global capture. */
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("cuCtxSynchronize during capture", cuCtxSynchronize(), 900);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);

    /* Another thread is refused during a global capture, but not during a thread-local one. */
    check("begin global", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("other thread's cuMemAlloc during global capture", in_thread(alloc_in_thread), 900);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);
    check("begin thread-local", cuStreamBeginCapture_v2(s, MODE_THREAD_LOCAL), 0);
    check("other thread's cuMemAlloc during thread-local capture", in_thread(alloc_in_thread),
          0);
    check("this thread's cuMemAlloc during thread-local capture", cuMemAlloc_v2(&p, 4096), 900);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);

    /* Relaxed capture: unsafe calls are allowed. */
    check("begin relaxed", cuStreamBeginCapture_v2(s, MODE_RELAXED), 0);
    check("cuMemAlloc during relaxed capture", cuMemAlloc_v2(&p, 4096), 0);
    check("cuMemFree during relaxed capture", cuMemFree_v2(p), 0);
    check("memset", cuMemsetD32Async(d, 0, N, s), 0);
    check("end relaxed", cuStreamEndCapture(s, &g), 0);
    check("destroy", cuGraphDestroy(g), 0);

    /* The thread's own mode relaxes a global capture. */
    check("begin global", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    mode = MODE_RELAXED;
    check("exchange mode", cuThreadExchangeStreamCaptureMode(&mode), 0);
    expect("previous mode was global", mode == MODE_GLOBAL);
    check("cuMemAlloc with a relaxed thread mode", cuMemAlloc_v2(&p, 4096), 0);
    check("cuMemFree with a relaxed thread mode", cuMemFree_v2(p), 0);
    check("exchange back", cuThreadExchangeStreamCaptureMode(&mode), 0);
    expect("previous mode was relaxed", mode == MODE_RELAXED);
    check("memset", cuMemsetD32Async(d, 0, N, s), 0);
    thread_stream = s;
    check("end from another thread", in_thread(end_in_thread), 908);
    check("end on the capturing thread", cuStreamEndCapture(s, &g), 0);
    check("destroy", cuGraphDestroy(g), 0);
    check("bad thread mode", cuThreadExchangeStreamCaptureMode(&(int){9}), 1);

    /* A relaxed capture may be ended by another thread. */
    check("begin relaxed", cuStreamBeginCapture_v2(s, MODE_RELAXED), 0);
    check("end relaxed from another thread", in_thread(end_in_thread), 0);

    /* The legacy stream while a blocking stream captures. */
    check("begin on a blocking stream", cuStreamBeginCapture_v2(blocking, MODE_GLOBAL), 0);
    check("legacy stream work", cuMemsetD8Async(d, 0, 1, NULL), 906);
    check("end invalidated", cuStreamEndCapture(blocking, &g), 901);

    /* Waiting for an event recorded outside the capture. */
    check("record outside", cuEventRecord(ev, other), 0);
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("wait for an uncaptured event", cuStreamWaitEvent(s, ev, 0), 905);
    check("end invalidated", cuStreamEndCapture(s, &g), 901);

    /* After all this the context still works. */
    check("memset", cuMemsetD32Async(d, ONE, N, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    check("ctx sync", cuCtxSynchronize(), 0);
}

static int host_calls;
static float host_seen;
static pthread_t host_thread;
static float host_y[N];

static void host_fn(void *arg) {
    host_calls++;
    host_seen = ((float *)arg)[7];
    host_thread = pthread_self();
}

static void mode_explicit(const char *dot_path) {
    static float hx[N], hw[N];
    CUdeviceptr x, y, w;
    CUgraph g, child, copy;
    CUgraphNode ms_y, k_y, ms_w, k_w, empty, dtoh, host, child_node, k_copy;
    CUgraphExec e, e2;
    CUstream s;
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 17);
    check("alloc", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&y, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&w, BYTES), 0);
    check("x", cuMemcpyHtoD_v2(x, hx, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);

    check("graph create", cuGraphCreate(&g, 0), 0);
    CUDA_MEMSET_NODE_PARAMS m1 = {y, 0, ONE, 4, N, 1};
    check("memset node y", cuGraphAddMemsetNode(&ms_y, g, NULL, 0, &m1, ctx), 0);
    CUDA_KERNEL_NODE_PARAMS kp = saxpy_params(0, 2.0f, x, y);
    check("kernel node y", cuGraphAddKernelNode(&k_y, g, &ms_y, 1, &kp), 0);
    CUDA_MEMSET_NODE_PARAMS m2 = {w, 0, TWO, 4, N, 1};
    check("memset node w", cuGraphAddMemsetNode(&ms_w, g, NULL, 0, &m2, ctx), 0);
    CUDA_KERNEL_NODE_PARAMS kp2 = saxpy_params(1, 3.0f, x, w);
    check("kernel node w (no dependency yet)", cuGraphAddKernelNode(&k_w, g, NULL, 0, &kp2), 0);
    check("add dependency", cuGraphAddDependencies(g, &ms_w, &k_w, 1), 0);
    check("add it twice", cuGraphAddDependencies(g, &ms_w, &k_w, 1), 1);
    CUgraphNode both[2] = {k_y, k_w};
    check("empty join node", cuGraphAddEmptyNode(&empty, g, both, 2), 0);
    CUDA_MEMCPY3D c = {0};
    c.srcMemoryType = DEVICE;
    c.srcDevice = y;
    c.dstMemoryType = HOST;
    c.dstHost = host_y;
    c.WidthInBytes = BYTES;
    c.Height = 1;
    c.Depth = 1;
    check("memcpy node DtoH", cuGraphAddMemcpyNode(&dtoh, g, &empty, 1, &c, ctx), 0);
    CUDA_HOST_NODE_PARAMS hp = {host_fn, host_y};
    check("host node", cuGraphAddHostNode(&host, g, &dtoh, 1, &hp), 0);
    check("child graph", cuGraphCreate(&child, 0), 0);
    CUgraphNode child_ms;
    CUDA_MEMSET_NODE_PARAMS m3 = {x + 4 * (N - 1), 0, 0, 4, 1, 1};
    check("child memset node", cuGraphAddMemsetNode(&child_ms, child, NULL, 0, &m3, ctx), 0);
    check("child graph node", cuGraphAddChildGraphNode(&child_node, g, &host, 1, child), 0);
    check("bad dependency", cuGraphAddEmptyNode(&(CUgraphNode){0}, g, &child_ms, 1), 1);
    check("bad kernel node", cuGraphAddKernelNode(&(CUgraphNode){0}, g, NULL, 0,
                                                  &(CUDA_KERNEL_NODE_PARAMS){0}), 1);

    expect("8 nodes", node_count(g) == 8);
    size_t n = 0;
    check("roots", cuGraphGetRootNodes(g, NULL, &n), 0);
    expect("two roots", n == 2);
    CUgraphNode deps[4];
    n = 4;
    check("dependencies of the join", cuGraphNodeGetDependencies(empty, deps, &n), 0);
    expect("join depends on both kernels", n == 2 && deps[0] == k_y && deps[1] == k_w);
    n = 4;
    check("dependents", cuGraphNodeGetDependentNodes(ms_w, deps, &n), 0);
    expect("memset w feeds kernel w", n == 1 && deps[0] == k_w);
    int t = -1;
    check("type", cuGraphNodeGetType(child_node, &t), 0);
    expect("child node type", t == NODE_GRAPH);
    check("type", cuGraphNodeGetType(host, &t), 0);
    expect("host node type", t == NODE_HOST);
    /* A cycle is refused at instantiation. */
    check("make a cycle", cuGraphAddDependencies(g, &child_node, &ms_y, 1), 0);
    check("instantiate a cycle", cuGraphInstantiateWithFlags(&e, g, 0), 1);
    check("remove it", cuGraphRemoveDependencies(g, &child_node, &ms_y, 1), 0);
    check("dot print", cuGraphDebugDotPrint(g, dot_path, 0), 0);
    FILE *f = fopen(dot_path, "r");
    char buf[8192] = {0};
    if (f) {
        fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    expect("dot output names kernels and edges",
           strstr(buf, "digraph") && strstr(buf, "saxpy") && strstr(buf, "->"));
    /* CUDA 13.1's IDs: the ones the dot output prints. */
    unsigned gid = 0, nid_y = 0, nid_w = 0;
    check("cuGraphGetId", cuGraphGetId(g, &gid), 0);
    check("cuGraphNodeGetLocalId", cuGraphNodeGetLocalId(k_y, &nid_y), 0);
    check("cuGraphNodeGetLocalId of another", cuGraphNodeGetLocalId(k_w, &nid_w), 0);
    expect("nodes have their own IDs", nid_y != nid_w);
    char gid_text[32], nid_text[48];
    snprintf(gid_text, sizeof gid_text, "graph %u\"", gid);
    snprintf(nid_text, sizeof nid_text, " %u\\n", nid_y);
    expect("the dot output prints the graph's and the node's IDs",
           strstr(buf, gid_text) && strstr(buf, nid_text));
    unsigned long long tools = 0;
    check("cuGraphNodeGetToolsId", cuGraphNodeGetToolsId(k_y, &tools), 0);
    expect("the tools ID holds both", tools == ((unsigned long long)gid << 32 | nid_y));
    CUgraph holder = NULL;
    check("cuGraphNodeGetContainingGraph", cuGraphNodeGetContainingGraph(k_y, &holder), 0);
    expect("the node's graph", holder == g);
    check("... of a child graph's node", cuGraphNodeGetContainingGraph(child_ms, &holder), 0);
    expect("the child graph", holder == child);
    check("cuGraphGetId of no graph", cuGraphGetId((CUgraph)0x1234, &gid), 1);
    check("cuGraphNodeGetLocalId of no node", cuGraphNodeGetLocalId((CUgraphNode)0x1234, &nid_y), 1);

    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    unsigned eid = 0;
    check("cuGraphExecGetId", cuGraphExecGetId(e, &eid), 0);
    expect("an executable graph's ID is its own", eid != gid);
    /* Changing the graph after instantiation does not change the executable graph. */
    CUDA_KERNEL_NODE_PARAMS kp9 = saxpy_params(2, 9.0f, x, y);
    check("set params in the graph", cuGraphKernelNodeSetParams(k_y, &kp9), 0);
    for (int rep = 0; rep < 3; rep++) {
        check("launch", cuGraphLaunch(e, s), 0);
    }
    check("sync", cuStreamSynchronize(s), 0);
    expect("host node ran once per launch", host_calls == 3);
    expect("host node ran on the host-function thread, not in cuGraphLaunch",
           !pthread_equal(host_thread, pthread_self()));
    expect("host node saw the copy before it", host_seen == 1.0f + 2.0f * hx[7]);
    hx[N - 1] = 0; /* the child graph zeroed it at the end of the first launch */
    expect("y = 1 + 2x", all_equal(host_y, hx, 1.0f, 2.0f));
    read_back(hw, w);
    expect("w = 2 + 3x", all_equal(hw, hx, 2.0f, 3.0f));

    /* Clone: the copy has its own nodes; the graph's later change (a = 9) is in it. */
    check("clone", cuGraphClone(&copy, g), 0);
    check("find in clone", cuGraphNodeFindInClone(&k_copy, k_y, copy), 0);
    expect("clone node differs", k_copy != k_y);
    CUDA_KERNEL_NODE_PARAMS kp5 = saxpy_params(3, 5.0f, x, y);
    check("set the clone's kernel", cuGraphKernelNodeSetParams(k_copy, &kp5), 0);
    check("instantiate clone", cuGraphInstantiateWithFlags(&e2, copy, 0), 0);
    check("launch clone", cuGraphLaunch(e2, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("clone computes y = 1 + 5x", all_equal(host_y, hx, 1.0f, 5.0f));
    check("launch original", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("original still computes y = 1 + 2x", all_equal(host_y, hx, 1.0f, 2.0f));
    expect("host node ran 5 times", host_calls == 5);
    check("destroy exec", cuGraphExecDestroy(e), 0);
    check("destroy exec", cuGraphExecDestroy(e2), 0);
    check("destroy child", cuGraphDestroy(child), 0);
    check("destroy clone", cuGraphDestroy(copy), 0);
    check("destroy", cuGraphDestroy(g), 0);
    check("destroyed graph", cuGraphGetNodes(g, NULL, &n), 1);
}

/* Captures memset(y = fill) then saxpy(a) on y, plus `extra` more kernels. */
static CUgraph capture_saxpy(CUstream s, unsigned fill, float a, CUdeviceptr x, CUdeviceptr y,
                             int extra) {
    CUgraph g = NULL;
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("memset", cuMemsetD32Async(y, fill, N, s), 0);
    check("kernel", launch_saxpy(s, a, x, y), 0);
    for (int i = 0; i < extra; i++) check("extra kernel", launch_saxpy(s, 0.0f, x, y), 0);
    check("end", cuStreamEndCapture(s, &g), 0);
    return g;
}

static void mode_update(void) {
    static float hx[N], hy[N];
    CUdeviceptr x, y;
    CUstream s;
    CUgraphExec e;
    CUgraphNode err = NULL, nodes[2];
    int result = -1;
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 23);
    check("alloc", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&y, BYTES), 0);
    check("x", cuMemcpyHtoD_v2(x, hx, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    CUgraph g1 = capture_saxpy(s, ONE, 2.0f, x, y, 0);
    size_t n = 2;
    check("nodes", cuGraphGetNodes(g1, nodes, &n), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g1, 0), 0);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("y = 1 + 2x", all_equal(hy, hx, 1.0f, 2.0f));

    CUgraph g2 = capture_saxpy(s, ONE, 4.0f, x, y, 0);
    check("exec update", cuGraphExecUpdate(e, g2, &err, &result), 0);
    expect("update result success", result == 0);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("updated: y = 1 + 4x", all_equal(hy, hx, 1.0f, 4.0f));

    CUgraph g3 = capture_saxpy(s, ONE, 8.0f, x, y, 1);
    check("update with another topology", cuGraphExecUpdate(e, g3, &err, &result), 910);
    expect("result: topology changed", result == 2);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("a refused update changes nothing", all_equal(hy, hx, 1.0f, 4.0f));

    CUDA_KERNEL_NODE_PARAMS kp = saxpy_params(0, 7.0f, x, y);
    check("exec kernel node set params", cuGraphExecKernelNodeSetParams(e, nodes[1], &kp), 0);
    CUDA_MEMSET_NODE_PARAMS mp = {y, 0, TWO, 4, N, 1};
    check("exec memset node set params", cuGraphExecMemsetNodeSetParams(e, nodes[0], &mp, ctx),
          0);
    check("set params of a node of the wrong type",
          cuGraphExecMemsetNodeSetParams(e, nodes[1], &mp, ctx), 1);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("set params: y = 2 + 7x", all_equal(hy, hx, 2.0f, 7.0f));
    check("destroy", cuGraphExecDestroy(e), 0);
    cuGraphDestroy(g1);
    cuGraphDestroy(g2);
    cuGraphDestroy(g3);
}

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f;
}

static void mode_mem(size_t slice) {
    static float hy[N];
    CUdeviceptr y;
    CUstream s;
    CUgraph g, g2, g3;
    CUgraphNode alloc, ms, cp, fr;
    CUgraphExec e, e2, e3;
    check("alloc y", cuMemAlloc_v2(&y, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    size_t before = free_mem();
    size_t size = 8 << 20;

    /* alloc -> memset -> copy out -> free: nothing stays charged. */
    check("graph", cuGraphCreate(&g, 0), 0);
    CUDA_MEM_ALLOC_NODE_PARAMS ap = {0};
    ap.poolProps[0] = 1;  /* pinned */
    ap.poolProps[8] = 1;  /* location: device */
    ap.bytesize = size;
    check("mem alloc node", cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap), 0);
    expect("alloc node gives an address", ap.dptr != 0);
    CUDA_MEMSET_NODE_PARAMS mp = {ap.dptr, 0, TWO, 4, size / 4, 1};
    check("memset node", cuGraphAddMemsetNode(&ms, g, &alloc, 1, &mp, ctx), 0);
    CUDA_MEMCPY3D c = {0};
    c.srcMemoryType = DEVICE;
    c.srcDevice = ap.dptr + size - BYTES;
    c.dstMemoryType = DEVICE;
    c.dstDevice = y;
    c.WidthInBytes = BYTES;
    c.Height = 1;
    c.Depth = 1;
    check("memcpy node", cuGraphAddMemcpyNode(&cp, g, &ms, 1, &c, ctx), 0);
    check("mem free node", cuGraphAddMemFreeNode(&fr, g, &cp, 1, ap.dptr), 0);
    int t = -1;
    cuGraphNodeGetType(alloc, &t);
    expect("alloc node type", t == NODE_MEM_ALLOC);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    for (int rep = 0; rep < 3; rep++) check("launch alloc/free graph", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("the graph's memory held its memset", hy[0] == 2.0f && hy[N - 1] == 2.0f);
    expect("freed within the graph: nothing charged", free_mem() == before);

    /* alloc without free: charged until cuMemFree; a second launch first needs the free. */
    check("graph 2", cuGraphCreate(&g2, 0), 0);
    CUDA_MEM_ALLOC_NODE_PARAMS ap2 = ap;
    ap2.dptr = 0;
    check("alloc node", cuGraphAddMemAllocNode(&alloc, g2, NULL, 0, &ap2), 0);
    CUDA_MEMSET_NODE_PARAMS mp2 = {ap2.dptr, 0, ONE, 4, size / 4, 1};
    check("memset node", cuGraphAddMemsetNode(&ms, g2, &alloc, 1, &mp2, ctx), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e2, g2, 0), 0);
    check("launch", cuGraphLaunch(e2, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("the allocation is charged to the slice", before - free_mem() == size);
    unsigned long long used = 0, high = 0, reserved = 0, zero = 0;
    check("cuDeviceGetGraphMemAttribute (used now)", cuDeviceGetGraphMemAttribute(0, 0, &used), 0);
    check("cuDeviceGetGraphMemAttribute (used high)", cuDeviceGetGraphMemAttribute(0, 1, &high), 0);
    check("cuDeviceGetGraphMemAttribute (reserved now)", cuDeviceGetGraphMemAttribute(0, 2, &reserved), 0);
    expect("graph memory in use is the mapped allocation", used == size && reserved == size && high >= size);
    check("relaunch before the free", cuGraphLaunch(e2, s), 1);
    check("free the graph's allocation", cuMemFree_v2(ap2.dptr), 0);
    expect("freed: uncharged", free_mem() == before);
    cuDeviceGetGraphMemAttribute(0, 0, &used);
    cuDeviceGetGraphMemAttribute(0, 1, &high);
    expect("freed: none in use, the high watermark stays", used == 0 && high >= size);
    check("reset the used high watermark", cuDeviceSetGraphMemAttribute(0, 1, &zero), 0);
    cuDeviceGetGraphMemAttribute(0, 1, &high);
    expect("reset to zero", high == 0);
    unsigned long long one = 1;
    check("a watermark set to anything but 0", cuDeviceSetGraphMemAttribute(0, 3, &one), 1);
    check("the current use cannot be set", cuDeviceSetGraphMemAttribute(0, 0, &zero), 1);
    check("an attribute CUDA does not have", cuDeviceGetGraphMemAttribute(0, 7, &used), 1);
    check("launch after the free", cuGraphLaunch(e2, s), 0);
    check("free async", cuMemFreeAsync(ap2.dptr, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("freed again: uncharged", free_mem() == before);

    /* Past the slice: the launch fails with out of memory. */
    check("graph 3", cuGraphCreate(&g3, 0), 0);
    CUDA_MEM_ALLOC_NODE_PARAMS ap3 = ap;
    ap3.bytesize = slice + (2 << 20);
    ap3.dptr = 0;
    check("huge alloc node", cuGraphAddMemAllocNode(&alloc, g3, NULL, 0, &ap3), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e3, g3, 0), 0);
    check("launch past the slice", cuGraphLaunch(e3, s), 2);
    expect("nothing charged", free_mem() == before);

    /* Stream-ordered allocation captured into a graph. */
    CUgraph g4;
    CUgraphExec e4;
    CUdeviceptr p = 0;
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    check("captured cuMemAllocAsync", cuMemAllocAsync(&p, size, s), 0);
    check("captured memset", cuMemsetD32Async(p, ONE, size / 4, s), 0);
    check("captured copy", cuMemcpyDtoDAsync_v2(y, p, BYTES, s), 0);
    check("captured cuMemFreeAsync", cuMemFreeAsync(p, s), 0);
    check("end", cuStreamEndCapture(s, &g4), 0);
    size_t n = 8;
    CUgraphNode nodes[8];
    check("nodes", cuGraphGetNodes(g4, nodes, &n), 0);
    int t0 = -1, t3 = -1;
    cuGraphNodeGetType(nodes[0], &t0);
    cuGraphNodeGetType(nodes[3], &t3);
    expect("alloc and free nodes", n == 4 && t0 == NODE_MEM_ALLOC && t3 == NODE_MEM_FREE);
    check("instantiate", cuGraphInstantiateWithFlags(&e4, g4, 0), 0);
    check("launch", cuGraphLaunch(e4, s), 0);
    check("launch again", cuGraphLaunch(e4, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    read_back(hy, y);
    expect("captured allocation held its memset", hy[0] == 1.0f && hy[N - 1] == 1.0f);
    expect("nothing stays charged", free_mem() == before);
    cuGraphExecDestroy(e);
    cuGraphExecDestroy(e2);
    cuGraphExecDestroy(e3);
    cuGraphExecDestroy(e4);
}

/* Parameters of the generic API for saxpy(a) on y (argument storage per slot). */
static CUgraphNodeParams generic_saxpy(int slot, float a, CUdeviceptr x, CUdeviceptr y) {
    CUDA_KERNEL_NODE_PARAMS k = saxpy_params(slot, a, x, y);
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = NODE_KERNEL;
    p.kernel.func = k.func;
    p.kernel.gridDimX = k.gridDimX;
    p.kernel.gridDimY = p.kernel.gridDimZ = 1;
    p.kernel.blockDimX = k.blockDimX;
    p.kernel.blockDimY = p.kernel.blockDimZ = 1;
    p.kernel.kernelParams = k.kernelParams;
    return p;
}

static CUgraphNodeParams generic_memset(CUdeviceptr dst, unsigned value, size_t words) {
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = NODE_MEMSET;
    p.memset.dst = dst;
    p.memset.value = value;
    p.memset.elementSize = 4;
    p.memset.width = words;
    p.memset.height = 1;
    p.memset.ctx = ctx;
    return p;
}

static CUgraphNodeParams generic_dtod(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = NODE_MEMCPY;
    p.memcpy.copyCtx = ctx;
    p.memcpy.copyParams.srcMemoryType = DEVICE;
    p.memcpy.copyParams.srcDevice = src;
    p.memcpy.copyParams.dstMemoryType = DEVICE;
    p.memcpy.copyParams.dstDevice = dst;
    p.memcpy.copyParams.WidthInBytes = bytes;
    p.memcpy.copyParams.Height = 1;
    p.memcpy.copyParams.Depth = 1;
    return p;
}

static CUgraphNodeParams generic_of_type(int type) {
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = type;
    return p;
}

static void count_call(void *counter) { (*(int *)counter)++; }

/* Whether every w[i] == v. */
static int all_are(CUdeviceptr w, float v) {
    static float hw[N];
    read_back(hw, w);
    for (int i = 0; i < N; i++)
        if (hw[i] != v) return 0;
    return 1;
}

static void mode_generic(void) {
    static float hx[N], hz[N];
    CUdeviceptr x, y, z, w;
    CUstream s;
    CUevent ev;
    CUgraph g, g2, child, child2, child3;
    CUgraphNode cn;
    CUgraphNode ms, k, cp, rec, join, host, sub, n0;
    CUgraphExec e, e2;
    int t = -1, host_calls_generic = 0;
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 13);
    check("alloc", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&y, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&z, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&w, BYTES), 0);
    check("x", cuMemcpyHtoD_v2(x, hx, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    check("event", cuEventCreate(&ev, 0), 0);

    /* memset y -> saxpy(2) -> copy y to z, and an event record; an empty node joins them. */
    check("graph", cuGraphCreate(&g, 0), 0);
    CUgraphNodeParams p = generic_memset(y, ONE, N);
    check("generic memset node", cuGraphAddNode(&ms, g, NULL, 0, &p), 0);
    p = generic_saxpy(0, 2.0f, x, y);
    check("generic kernel node", cuGraphAddNode(&k, g, &ms, 1, &p), 0);
    p = generic_dtod(z, y, BYTES);
    check("generic memcpy node", cuGraphAddNode(&cp, g, &k, 1, &p), 0);
    p = generic_of_type(NODE_EVENT_RECORD);
    p.eventRecord.event = ev;
    check("generic event record node", cuGraphAddNode(&rec, g, &k, 1, &p), 0);
    p = generic_of_type(NODE_HOST);
    p.host.fn = count_call;
    p.host.userData = &host_calls_generic;
    check("generic host node", cuGraphAddNode(&host, g, &cp, 1, &p), 0);
    CUgraphNode both[2] = {host, rec};
    CUgraphEdgeData edges[2];
    memset(edges, 0, sizeof edges);
    edges[1].type = 1; /* CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC */
    p = generic_of_type(NODE_EMPTY);
    check("programmatic edge data refused", cuGraphAddNode_v2(&join, g, both, edges, 2, &p), 801);
    edges[1].type = 0;
    check("generic empty join (_v2, default edges)",
          cuGraphAddNode_v2(&join, g, both, edges, 2, &p), 0);
    check("generic empty join (_v2, NULL edge data)",
          cuGraphAddNode_v2(&n0, g, both, NULL, 2, &p), 0);
    check("child graph", cuGraphCreate(&child, 0), 0);
    p = generic_memset(w, ONE, N);
    check("child memset w = 1", cuGraphAddNode(&cn, child, NULL, 0, &p), 0);
    p = generic_of_type(NODE_GRAPH);
    p.graph.graph = child;
    check("generic child graph node (clone)", cuGraphAddNode(&sub, g, &join, 1, &p), 0);
    expect("8 nodes", node_count(g) == 8);
    cuGraphNodeGetType(k, &t);
    expect("kernel node type", t == NODE_KERNEL);
    cuGraphNodeGetType(cp, &t);
    expect("memcpy node type", t == NODE_MEMCPY);
    cuGraphNodeGetType(rec, &t);
    expect("event record node type", t == NODE_EVENT_RECORD);
    cuGraphNodeGetType(sub, &t);
    expect("child node type", t == NODE_GRAPH);
    /* CUDA 13.2's generic getter: each node's type and parameters, as they were given. */
    CUgraphNodeParams got;
    check("node get params (memset)", cuGraphNodeGetParams(ms, &got), 0);
    expect("the memset's type and fields", got.type == NODE_MEMSET && got.memset.dst == y &&
                                              got.memset.value == ONE && got.memset.width == N &&
                                              got.memset.elementSize == 4);
    check("node get params (kernel)", cuGraphNodeGetParams(k, &got), 0);
    expect("the kernel's type and launch", got.type == NODE_KERNEL && got.kernel.func == saxpy &&
                                               got.kernel.blockDimX == 128);
    CUgraphNode k_again;
    check("a node built from them", cuGraphAddNode(&k_again, g, &ms, 1, &got), 0);
    check("node get params (memcpy)", cuGraphNodeGetParams(cp, &got), 0);
    expect("the copy's type and extent", got.type == NODE_MEMCPY &&
                                             got.memcpy.copyParams.WidthInBytes == BYTES &&
                                             got.memcpy.copyParams.dstDevice == z);
    check("node get params (event record)", cuGraphNodeGetParams(rec, &got), 0);
    expect("the recorded event", got.type == NODE_EVENT_RECORD && got.eventRecord.event == ev);
    check("node get params (host)", cuGraphNodeGetParams(host, &got), 0);
    expect("the host function", got.type == NODE_HOST && got.host.fn == count_call &&
                                    got.host.userData == &host_calls_generic);
    check("node get params (child graph)", cuGraphNodeGetParams(sub, &got), 0);
    expect("the node's own copy of the graph", got.type == NODE_GRAPH && got.graph.graph != NULL &&
                                                   got.graph.graph != child);
    check("node get params of no node", cuGraphNodeGetParams((CUgraphNode)0x1234, &got), 1);
    check("node get params without room", cuGraphNodeGetParams(k, NULL), 1);
    check("remove the rebuilt node", cuGraphDestroyNode(k_again), 0);
    size_t n = 4;
    CUgraphNode deps[4];
    check("join dependencies", cuGraphNodeGetDependencies(join, deps, &n), 0);
    expect("join depends on the host node and the record", n == 2 && deps[0] == host &&
                                                              deps[1] == rec);

    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    check("z", cuMemcpyDtoH_v2(hz, z, BYTES), 0);
    expect("z = 1 + 2x", all_equal(hz, hx, 1.0f, 2.0f));
    check("the event node recorded the event", cuEventQuery(ev), 0);
    expect("the host node ran once", host_calls_generic == 1);
    expect("the child graph ran: w = 1", all_are(w, 1.0f));

    /* cuGraphNodeSetParams changes the graph, not the executable graph made before. */
    p = generic_saxpy(1, 3.0f, x, y);
    check("node set params (kernel)", cuGraphNodeSetParams(k, &p), 0);
    check("node set params of another type", cuGraphNodeSetParams(ms, &p), 1);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    check("z", cuMemcpyDtoH_v2(hz, z, BYTES), 0);
    expect("the executable graph still computes z = 1 + 2x", all_equal(hz, hx, 1.0f, 2.0f));
    check("instantiate again", cuGraphInstantiateWithFlags(&e2, g, 0), 0);
    check("launch", cuGraphLaunch(e2, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    check("z", cuMemcpyDtoH_v2(hz, z, BYTES), 0);
    expect("the new one computes z = 1 + 3x", all_equal(hz, hx, 1.0f, 3.0f));

    /* cuGraphExecNodeSetParams changes the executable graph. */
    p = generic_saxpy(2, 5.0f, x, y);
    check("exec node set params (kernel)", cuGraphExecNodeSetParams(e, k, &p), 0);
    p = generic_memset(y, TWO, N);
    check("exec node set params (memset)", cuGraphExecNodeSetParams(e, ms, &p), 0);
    check("exec node set params of another type", cuGraphExecNodeSetParams(e, k, &p), 1);
    check("child graph 2", cuGraphCreate(&child2, 0), 0);
    p = generic_memset(w, TWO, N);
    check("child 2 memset w = 2", cuGraphAddNode(&cn, child2, NULL, 0, &p), 0);
    check("child graph 3", cuGraphCreate(&child3, 0), 0);
    CUgraphNode c3;
    check("child 3 memset", cuGraphAddNode(&c3, child3, NULL, 0, &p), 0);
    check("child 3 second memset", cuGraphAddNode(&cn, child3, &c3, 1, &p), 0);
    p = generic_of_type(NODE_GRAPH);
    p.graph.graph = child3;
    check("exec set params: a child graph of another shape",
          cuGraphExecNodeSetParams(e, sub, &p), 1);
    p.graph.graph = child2;
    check("set params of a child graph node in a graph", cuGraphNodeSetParams(sub, &p), 801);
    check("exec set params of a child graph node", cuGraphExecNodeSetParams(e, sub, &p), 0);
    check("launch", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    check("z", cuMemcpyDtoH_v2(hz, z, BYTES), 0);
    expect("exec set params: z = 2 + 5x", all_equal(hz, hx, 2.0f, 5.0f));
    expect("the new child graph ran: w = 2", all_are(w, 2.0f));
    expect("the host node ran once per launch (4)", host_calls_generic == 4);

    /* Kernel node attributes: the priority, clamped to the device's range [-5, 0]
     * (docs/graphs.md); used by graphs instantiated with USE_NODE_PRIORITY. */
    CUkernelNodeAttrValue av;
    memset(&av, 0, sizeof av);
    check("get the priority", cuGraphKernelNodeGetAttribute(k, ATTR_PRIORITY, &av), 0);
    expect("a new node has the default priority 0", av.priority == 0);
    av.priority = -3;
    check("set a node priority", cuGraphKernelNodeSetAttribute(k, ATTR_PRIORITY, &av), 0);
    av.priority = 7;
    check("get the priority", cuGraphKernelNodeGetAttribute(k, ATTR_PRIORITY, &av), 0);
    expect("the priority is kept", av.priority == -3);
    av.priority = -40;
    check("set a priority past the highest", cuGraphKernelNodeSetAttribute(k, ATTR_PRIORITY, &av),
          0);
    check("get the priority", cuGraphKernelNodeGetAttribute(k, ATTR_PRIORITY, &av), 0);
    expect("clamped to the highest, -5", av.priority == -5);
    av.priority = 9;
    check("set a priority below the lowest", cuGraphKernelNodeSetAttribute(k, ATTR_PRIORITY, &av),
          0);
    check("get the priority", cuGraphKernelNodeGetAttribute(k, ATTR_PRIORITY, &av), 0);
    expect("clamped to the lowest, 0", av.priority == 0);
    av.priority = -2;
    check("set a node priority", cuGraphKernelNodeSetAttribute(k, ATTR_PRIORITY, &av), 0);
    p = generic_saxpy(1, 3.0f, x, y);
    check("node set params keeps the priority", cuGraphNodeSetParams(k, &p), 0);
    check("get the priority", cuGraphKernelNodeGetAttribute(k, ATTR_PRIORITY, &av), 0);
    expect("still -2", av.priority == -2);
    {
        CUgraphExec ep;
        /* CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: the kernel runs with its own. */
        check("instantiate with node priorities", cuGraphInstantiateWithFlags(&ep, g, 0x8), 0);
        check("launch", cuGraphLaunch(ep, s), 0);
        check("sync", cuStreamSynchronize(s), 0);
        check("z", cuMemcpyDtoH_v2(hz, z, BYTES), 0);
        expect("the prioritized node computed z = 1 + 3x", all_equal(hz, hx, 1.0f, 3.0f));
        check("destroy", cuGraphExecDestroy(ep), 0);
    }
    av.cooperative = 1;
    check("cooperative node: not supported",
          cuGraphKernelNodeSetAttribute(k, ATTR_COOPERATIVE, &av), 801);
    check("attribute of a memset node", cuGraphKernelNodeSetAttribute(ms, ATTR_PRIORITY, &av),
          1);

    /* Types vgpu does not build, unknown types and reserved fields. */
    int refused[] = {NODE_EXT_SEMAS_SIGNAL, NODE_EXT_SEMAS_WAIT};
    for (int i = 0; i < 2; i++) {
        p = generic_of_type(refused[i]);
        check("refused node type: not supported", cuGraphAddNode(&n0, g, NULL, 0, &p), 801);
    }
    /* Conditional nodes: tests/c/graph_conditionals.c; one on no handle is refused. */
    p = generic_of_type(NODE_CONDITIONAL);
    check("a conditional node without a handle", cuGraphAddNode(&n0, g, NULL, 0, &p), 1);
    p = generic_of_type(NODE_BATCH_MEM_OP);
    check("a batch memory-operation node of no operations", cuGraphAddNode(&n0, g, NULL, 0, &p), 1);
    p = generic_of_type(99);
    check("unknown node type", cuGraphAddNode(&n0, g, NULL, 0, &p), 1);
    p = generic_of_type(NODE_EMPTY);
    p.reserved0[1] = 1;
    check("reserved field set", cuGraphAddNode(&n0, g, NULL, 0, &p), 1);
    expect("nothing added by refused calls", node_count(g) == 8);

    /* An allocation node through the generic API: its address comes back and is charged. */
    size_t before = free_mem(), size = 8 << 20;
    check("graph 2", cuGraphCreate(&g2, 0), 0);
    CUgraphNode alloc, ms2, cp2, wait, fr;
    p = generic_of_type(NODE_MEM_ALLOC);
    p.alloc.poolProps[0] = 1; /* pinned */
    p.alloc.poolProps[8] = 1; /* location: device */
    p.alloc.bytesize = size;
    check("generic mem alloc node", cuGraphAddNode(&alloc, g2, NULL, 0, &p), 0);
    CUdeviceptr a = p.alloc.dptr;
    expect("the alloc node's dptr was filled in", a != 0);
    check("set params of an alloc node", cuGraphNodeSetParams(alloc, &p), 1);
    p = generic_memset(a, TWO, size / 4);
    check("memset the allocation", cuGraphAddNode(&ms2, g2, &alloc, 1, &p), 0);
    p = generic_dtod(y, a + size - BYTES, BYTES);
    check("copy out of it", cuGraphAddNode(&cp2, g2, &ms2, 1, &p), 0);
    p = generic_of_type(NODE_WAIT_EVENT);
    p.eventWait.event = ev;
    check("generic event wait node", cuGraphAddNode(&wait, g2, &cp2, 1, &p), 0);
    cuGraphNodeGetType(wait, &t);
    expect("event wait node type", t == NODE_WAIT_EVENT);
    CUgraphExec e3;
    check("instantiate", cuGraphInstantiateWithFlags(&e3, g2, 0), 0);
    check("launch", cuGraphLaunch(e3, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("the allocation is charged to the slice", before - free_mem() == size);
    static float hy[N];
    read_back(hy, y);
    expect("the allocation held its memset", hy[0] == 2.0f && hy[N - 1] == 2.0f);
    check("free it", cuMemFree_v2(a), 0);
    expect("freed: uncharged", free_mem() == before);
    /* A generic free node: launches alloc, memset, copy, free; nothing stays charged. */
    p = generic_of_type(NODE_MEM_FREE);
    p.free.dptr = a;
    check("generic mem free node", cuGraphAddNode(&fr, g2, &wait, 1, &p), 0);
    cuGraphNodeGetType(fr, &t);
    expect("free node type", t == NODE_MEM_FREE);
    p.free.dptr = y;
    check("free node of a non-graph allocation", cuGraphAddNode(&n0, g2, NULL, 0, &p), 1);
    CUgraphExec e4;
    check("instantiate with the free", cuGraphInstantiateWithFlags(&e4, g2, 0), 0);
    for (int rep = 0; rep < 2; rep++) check("launch", cuGraphLaunch(e4, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    expect("freed within the graph: nothing charged", free_mem() == before);

    cuGraphExecDestroy(e);
    cuGraphExecDestroy(e2);
    cuGraphExecDestroy(e3);
    cuGraphExecDestroy(e4);
    check("destroy", cuGraphDestroy(g), 0);
    check("destroy", cuGraphDestroy(g2), 0);
    check("destroy child", cuGraphDestroy(child), 0);
    check("destroy child 2", cuGraphDestroy(child2), 0);
    check("destroy child 3", cuGraphDestroy(child3), 0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One tiny kernel (1 block of 32 threads over 32 elements). */
static CUresult tiny(CUstream s, CUdeviceptr x, CUdeviceptr y) {
    int n = 32;
    float a = 1.0f;
    void *args[] = {&n, &a, &x, &y};
    return cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
}

static void mode_bench(int kernels, int reps) {
    CUdeviceptr x, y;
    CUstream s;
    CUgraph g;
    CUgraphExec e;
    check("alloc", cuMemAlloc_v2(&x, BYTES), 0);
    check("alloc", cuMemAlloc_v2(&y, BYTES), 0);
    check("stream", cuStreamCreate(&s, 1), 0);
    check("begin", cuStreamBeginCapture_v2(s, MODE_GLOBAL), 0);
    for (int i = 0; i < kernels; i++) tiny(s, x, y);
    check("end", cuStreamEndCapture(s, &g), 0);
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("warm up", cuGraphLaunch(e, s), 0);
    check("sync", cuStreamSynchronize(s), 0);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < kernels; i++) tiny(s, x, y);
        cuStreamSynchronize(s);
        double t1 = now();
        cuGraphLaunch(e, s);
        cuStreamSynchronize(s);
        double t2 = now();
        printf("sample launches_us %.3f graph_us %.3f\n", (t1 - t0) * 1e6 / kernels,
               (t2 - t1) * 1e6 / kernels);
    }
    fflush(stdout);
}

static int destroyed_count;
static void count_destroyed(void *arg) { __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST); }

/* Waits up to two seconds for the destructor count to reach `want`. */
static int destroyed_reaches(int want) {
    for (int i = 0; i < 200; i++) {
        if (__atomic_load_n(&destroyed_count, __ATOMIC_SEQ_CST) >= want) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return __atomic_load_n(&destroyed_count, __ATOMIC_SEQ_CST) == want;
}

static void mode_userobjects(void) {
    const int INVALID_VALUE = 1;
    CUuserObject obj = NULL, bad = NULL;
    check("cuUserObjectCreate without NO_DESTRUCTOR_SYNC",
          cuUserObjectCreate(&bad, &destroyed_count, count_destroyed, 1, 0), INVALID_VALUE);
    check("cuUserObjectCreate with no references",
          cuUserObjectCreate(&bad, &destroyed_count, count_destroyed, 0, 1), INVALID_VALUE);
    check("cuUserObjectCreate without a destructor", cuUserObjectCreate(&bad, &destroyed_count, NULL, 1, 1),
          INVALID_VALUE);
    check("cuUserObjectCreate", cuUserObjectCreate(&obj, &destroyed_count, count_destroyed, 1, 1), 0);
    CUgraph g, c;
    check("cuGraphCreate", cuGraphCreate(&g, 0), 0);
    CUgraphNode n;
    check("an empty node", cuGraphAddEmptyNode(&n, g, NULL, 0), 0);
    check("cuGraphRetainUserObject (2 references)", cuGraphRetainUserObject(g, obj, 2, 0), 0);
    check("cuGraphRetainUserObject with unknown flags", cuGraphRetainUserObject(g, obj, 1, 2), INVALID_VALUE);
    check("cuGraphRetainUserObject of no references", cuGraphRetainUserObject(g, obj, 0, 0), INVALID_VALUE);
    check("cuUserObjectRetain", cuUserObjectRetain(obj, 3), 0);
    check("cuUserObjectRelease (the program's 4)", cuUserObjectRelease(obj, 4), 0);
    check("cuGraphClone", cuGraphClone(&c, g), 0);
    CUgraphExec e;
    check("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    check("cuGraphReleaseUserObject of more than the graph holds", cuGraphReleaseUserObject(g, obj, 3),
          INVALID_VALUE);
    check("cuGraphReleaseUserObject (1 of 2)", cuGraphReleaseUserObject(g, obj, 1), 0);
    check("cuGraphDestroy", cuGraphDestroy(g), 0);
    check("cuGraphDestroy of the clone", cuGraphDestroy(c), 0);
    check("cuGraphLaunch", cuGraphLaunch(e, NULL), 0);
    check("cuCtxSynchronize", cuCtxSynchronize(), 0);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    expect("the destructor waits for the executable graph's reference", destroyed_count == 0);
    check("cuGraphExecDestroy", cuGraphExecDestroy(e), 0);
    expect("the last reference gone, the destructor ran once", destroyed_reaches(1));
    check("a destroyed user object", cuUserObjectRetain(obj, 1), INVALID_VALUE);

    /* References moved into a graph. */
    CUuserObject moved = NULL;
    check("cuUserObjectCreate (to move)", cuUserObjectCreate(&moved, &destroyed_count, count_destroyed, 2, 1), 0);
    CUgraph g2;
    check("cuGraphCreate", cuGraphCreate(&g2, 0), 0);
    check("cuGraphRetainUserObject with CU_GRAPH_USER_OBJECT_MOVE", cuGraphRetainUserObject(g2, moved, 2, 1), 0);
    check("cuGraphDestroy", cuGraphDestroy(g2), 0);
    expect("moved references went with the graph", destroyed_reaches(2));
    check("cuUserObjectRelease of a forged object", cuUserObjectRelease((CUuserObject)(uintptr_t)0x1234, 1),
          INVALID_VALUE);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: graphs MODE SAXPY_PTX [ARG]\n");
        return 2;
    }
    setup(argv[2]);
    const char *m = argv[1];
    if (!strcmp(m, "capture")) mode_capture();
    else if (!strcmp(m, "fork")) mode_fork();
    else if (!strcmp(m, "branches")) mode_branches();
    else if (!strcmp(m, "errors")) mode_errors();
    else if (!strcmp(m, "explicit")) mode_explicit(argc > 3 ? argv[3] : "/tmp/vgpu-graph.dot");
    else if (!strcmp(m, "update")) mode_update();
    else if (!strcmp(m, "mem") && argc > 3) mode_mem(strtoull(argv[3], NULL, 0));
    else if (!strcmp(m, "generic")) mode_generic();
    else if (!strcmp(m, "hostcopy")) mode_hostcopy();
    else if (!strcmp(m, "userobjects")) mode_userobjects();
    else if (!strcmp(m, "bench") && argc > 4) mode_bench(atoi(argv[3]), atoi(argv[4]));
    else {
        fprintf(stderr, "unknown mode %s\n", m);
        return 2;
    }
    printf("done\n");
    return failures;
}
