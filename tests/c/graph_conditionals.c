/*
 * Conditional graph nodes (CUDA 12.3+) as a C program builds them through cuda.h:
 * cuGraphConditionalHandleCreate, if/else, while and switch nodes added with cuGraphAddNode
 * (their body graphs handed back in phGraph_out), bodies filled with explicit nodes or captured
 * with cuStreamBeginCaptureToGraph (as cuda.core, CuPy and PyTorch do), a switch nested in an
 * if, and the kernels of devices/ptx/fixtures/conditionals.cu (NVRTC's PTX, loaded from the file
 * named by argv[1]) setting the handles with cudaGraphSetConditional.
 *
 * Also: each launch starts from the handles' defaults; the executable graph outlives its graph;
 * clones; the node's type and the Graphviz print; refusals with CUDA's codes (bad types and body
 * counts, unknown handles and flags, a host node in a body, changing a conditional node); a
 * kernel setting a handle outside any graph launch fails its own context only.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUgraphConditionalHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
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
    void (*fn)(void *);
    void *userData;
} CUDA_HOST_NODE_PARAMS;

typedef struct {
    CUgraphConditionalHandle handle;
    int type;
    unsigned int size;
    CUgraph *phGraph_out;
    CUcontext ctx;
} CUDA_CONDITIONAL_NODE_PARAMS;

typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_CONDITIONAL_NODE_PARAMS conditional;
    };
    long long reserved2;
} CUgraphNodeParams;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode *, const void *, size_t,
                                     int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphClone(CUgraph *, CUgraph);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphNodeGetType(CUgraphNode, int *);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuGraphNodeGetParams(CUgraphNode, CUgraphNodeParams *);
CUresult cuGraphNodeSetParams(CUgraphNode, CUgraphNodeParams *);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphAddHostNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                            const CUDA_HOST_NODE_PARAMS *);
CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle *, CUgraph, CUcontext, unsigned,
                                        unsigned);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *, int *);
CUresult cuGraphDebugDotPrint(CUgraph, const char *, unsigned int);

#define INVALID_VALUE 1
#define NOT_FOUND 500
#define VERSION_NOT_SUFFICIENT 2
#define ILLEGAL_INSTRUCTION 715
#define NOT_SUPPORTED 801
#define CONDITIONAL_NODE 13
#define COND_IF 0
#define COND_WHILE 1
#define COND_SWITCH 2
#define ASSIGN_DEFAULT 1u
#define UPDATE_NOT_SUPPORTED 6
#define CAPTURE_GLOBAL 0

static CUfunction set_handle, add_one, count_down;
static CUdeviceptr cells; /* four ints */
static CUcontext ctx;

static void put(const int v[4]) { cuMemcpyHtoD_v2(cells, v, 4 * sizeof(int)); }

static void get(int v[4]) { cuMemcpyDtoH_v2(v, cells, 4 * sizeof(int)); }

static int same(const int a[4], int a0, int a1, int a2, int a3) {
    return a[0] == a0 && a[1] == a1 && a[2] == a2 && a[3] == a3;
}

/* A one-thread kernel node of `f` with `args`. */
static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           CUfunction f, void **args) {
    CUDA_KERNEL_NODE_PARAMS p = {f, 1, 1, 1, 1, 1, 1, 0, args, NULL};
    return cuGraphAddKernelNode(out, g, deps, n, &p);
}

/* A conditional node of `type` with `size` bodies on `h`; the bodies come back in `bodies`. */
static CUresult add_conditional(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                CUgraphConditionalHandle h, int type, unsigned size,
                                CUgraph **bodies) {
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CONDITIONAL_NODE;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    p.conditional.ctx = ctx;
    CUresult r = cuGraphAddNode(out, g, deps, n, &p);
    if (bodies) *bodies = p.conditional.phGraph_out;
    return r;
}

static void host_fn(void *data) { (void)data; }

/* while (h) { cells[0] += 1; h = --cells[3] > 0; }, its bodies added node by node. */
static void while_loop(void) {
    CUgraph g;
    CUgraphConditionalHandle h;
    cuGraphCreate(&g, 0);
    check("cuGraphConditionalHandleCreate (default 1, assigned at each launch)",
          cuGraphConditionalHandleCreate(&h, g, ctx, 1, ASSIGN_DEFAULT), 0);
    CUgraphNode node, a, b;
    CUgraph *body = NULL;
    check("cuGraphAddNode: a while node",
          add_conditional(&node, g, NULL, 0, h, COND_WHILE, 1, &body), 0);
    expect("the node hands back its body graph", body != NULL && body[0] != NULL);
    int type = -1;
    cuGraphNodeGetType(node, &type);
    expect("cuGraphNodeGetType: CU_GRAPH_NODE_TYPE_CONDITIONAL", type == CONDITIONAL_NODE);
    CUdeviceptr left = cells + 3 * sizeof(int);
    void *add_args[] = {&cells};
    void *count_args[] = {&left, &h};
    check("a kernel node in the body", add_kernel(&a, body[0], NULL, 0, add_one, add_args), 0);
    check("a second one after it", add_kernel(&b, body[0], &a, 1, count_down, count_args), 0);
    CUgraphExec e;
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    int v[4] = {0, 0, 0, 5};
    put(v);
    check("launch", cuGraphLaunch(e, NULL), 0);
    check("synchronize", cuCtxSynchronize(), 0);
    get(v);
    expect("the loop ran 5 times", same(v, 5, 0, 0, 0));

    /* The executable graph outlives its graph; each launch starts from the default. */
    check("cuGraphDestroy after instantiation", cuGraphDestroy(g), 0);
    v[3] = 3;
    put(v);
    cuGraphLaunch(e, NULL);
    check("launch after the graph is gone", cuCtxSynchronize(), 0);
    get(v);
    expect("3 more iterations", same(v, 8, 0, 0, 0));
    cuGraphExecDestroy(e);
}

/* h = value; if (h) { cells[0] += 2 } else { cells[1] += 1 }; cells[2] += 1, its bodies captured. */
static void if_else(unsigned value) {
    char what[96];
    CUgraph g;
    CUgraphConditionalHandle h;
    cuGraphCreate(&g, 0);
    cuGraphConditionalHandleCreate(&h, g, ctx, 0, 0);
    CUgraphNode set, cond, after;
    void *set_args[] = {&h, &value};
    add_kernel(&set, g, NULL, 0, set_handle, set_args);
    CUgraph *bodies = NULL;
    snprintf(what, sizeof what, "an if/else node (value %u)", value);
    check(what, add_conditional(&cond, g, &set, 1, h, COND_IF, 2, &bodies), 0);
    CUgraphNodeParams got;
    check("cuGraphNodeGetParams of the conditional node", cuGraphNodeGetParams(cond, &got), 0);
    expect("its handle, type, bodies and their array",
           got.type == CONDITIONAL_NODE && got.conditional.handle == h &&
               got.conditional.type == COND_IF && got.conditional.size == 2 &&
               got.conditional.phGraph_out == bodies);
    CUstream s;
    cuStreamCreate(&s, 0);
    CUdeviceptr second = cells + sizeof(int), third = cells + 2 * sizeof(int);
    void *then_args[] = {&cells};
    void *else_args[] = {&second};
    check("cuStreamBeginCaptureToGraph: the then body",
          cuStreamBeginCaptureToGraph(s, bodies[0], NULL, NULL, 0, CAPTURE_GLOBAL), 0);
    cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, s, then_args, NULL);
    cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, s, then_args, NULL);
    CUgraph captured = NULL;
    check("end the capture", cuStreamEndCapture(s, &captured), 0);
    expect("the capture filled the body", captured == bodies[0]);
    cuStreamBeginCaptureToGraph(s, bodies[1], NULL, NULL, 0, CAPTURE_GLOBAL);
    cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, s, else_args, NULL);
    check("the else body", cuStreamEndCapture(s, &captured), 0);
    void *after_args[] = {&third};
    add_kernel(&after, g, &cond, 1, add_one, after_args);
    CUgraphExec e;
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    int v[4] = {0, 0, 0, 0};
    put(v);
    cuGraphLaunch(e, s);
    check("run", cuStreamSynchronize(s), 0);
    get(v);
    snprintf(what, sizeof what, "value %u chose the %s body", value, value ? "then" : "else");
    expect(what, value ? same(v, 2, 0, 1, 0) : same(v, 0, 1, 1, 0));
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
    cuStreamDestroy_v2(s);
}

/* A kernel that takes 64 bytes of the device heap, writes 42 there and copies it to *cell
 * (-1 when malloc answers NULL). */
static const char HEAP_PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".extern .func (.param .b64 r) malloc(.param .b64 n);\n"
    ".extern .func free(.param .b64 p);\n"
    ".visible .entry from_heap(.param .u64 cell) {\n"
    ".reg .b64 %rd<4>; .reg .b32 %r<2>; .reg .pred %p1;\n"
    "ld.param.u64 %rd1, [cell];\n"
    "mov.u64 %rd3, 64;\n"
    "{ .param .b64 n; .param .b64 r; st.param.b64 [n], %rd3;\n"
    "  call.uni (r), malloc, (n); ld.param.b64 %rd2, [r]; }\n"
    "setp.eq.u64 %p1, %rd2, 0;\n"
    "@%p1 bra NONE;\n"
    "mov.u32 %r1, 42; st.u32 [%rd2], %r1; ld.u32 %r1, [%rd2]; st.global.u32 [%rd1], %r1;\n"
    "{ .param .b64 q; st.param.b64 [q], %rd2; call.uni free, (q); }\n"
    "ret;\n"
    "NONE: mov.u32 %r1, -1; st.global.u32 [%rd1], %r1; ret; }\n";

/* if (h, default 1) { cells[1] = from the heap }: a body's kernel has the device heap a launch
 * of it would have. */
static void heap_in_body(void) {
    CUmodule hm;
    CUfunction from_heap;
    check("cuModuleLoadData (a kernel calling malloc)", cuModuleLoadData(&hm, HEAP_PTX), 0);
    cuModuleGetFunction(&from_heap, hm, "from_heap");
    CUgraph g;
    CUgraphConditionalHandle h;
    cuGraphCreate(&g, 0);
    cuGraphConditionalHandleCreate(&h, g, ctx, 1, ASSIGN_DEFAULT);
    CUgraphNode cond, k;
    CUgraph *body = NULL;
    add_conditional(&cond, g, NULL, 0, h, COND_IF, 1, &body);
    CUdeviceptr second = cells + sizeof(int);
    void *args[] = {&second};
    check("a body kernel that calls malloc", add_kernel(&k, body[0], NULL, 0, from_heap, args), 0);
    CUgraphExec e;
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), 0);
    int v[4] = {0, 0, 0, 0};
    put(v);
    cuGraphLaunch(e, NULL);
    check("run", cuCtxSynchronize(), 0);
    get(v);
    expect("the body's kernel got memory from the device heap", same(v, 0, 42, 0, 0));
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
    cuModuleUnload(hm);
}

/* if (outer, default 1) { h = value; switch (h) { case n: cells[n] += 1 } }. */
static void nested_switch(unsigned value) {
    char what[96];
    CUgraph g;
    CUgraphConditionalHandle outer, h;
    cuGraphCreate(&g, 0);
    cuGraphConditionalHandleCreate(&outer, g, ctx, 1, ASSIGN_DEFAULT);
    cuGraphConditionalHandleCreate(&h, g, ctx, 0, 0);
    CUgraphNode cond, set, sw, k;
    CUgraph *outer_body, *cases;
    add_conditional(&cond, g, NULL, 0, outer, COND_IF, 1, &outer_body);
    void *set_args[] = {&h, &value};
    add_kernel(&set, outer_body[0], NULL, 0, set_handle, set_args);
    check("a switch node of 3 cases inside an if body",
          add_conditional(&sw, outer_body[0], &set, 1, h, COND_SWITCH, 3, &cases), 0);
    CUdeviceptr at[3];
    void *args[3][1];
    for (int i = 0; i < 3; i++) {
        at[i] = cells + i * sizeof(int);
        args[i][0] = &at[i];
        add_kernel(&k, cases[i], NULL, 0, add_one, args[i]);
    }
    /* A clone runs as the original would. */
    CUgraph copy;
    check("cuGraphClone of a graph with conditional nodes", cuGraphClone(&copy, g), 0);
    CUgraphExec e;
    check("instantiate the clone", cuGraphInstantiateWithFlags(&e, copy, 0), 0);
    int v[4] = {0, 0, 0, 0};
    put(v);
    cuGraphLaunch(e, NULL);
    check("run", cuCtxSynchronize(), 0);
    get(v);
    snprintf(what, sizeof what, "switch (%u) ran %s", value, value < 3 ? "its case" : "nothing");
    expect(what, same(v, value == 0, value == 1, value == 2, 0));
    cuGraphExecDestroy(e);
    cuGraphDestroy(copy);
    cuGraphDestroy(g);
}

static void refusals(void) {
    CUgraph g, other;
    CUgraphConditionalHandle h;
    cuGraphCreate(&g, 0);
    check("a NULL handle pointer", cuGraphConditionalHandleCreate(NULL, g, ctx, 0, 0),
          INVALID_VALUE);
    check("unknown handle flags", cuGraphConditionalHandleCreate(&h, g, ctx, 0, 2), INVALID_VALUE);
    cuGraphConditionalHandleCreate(&h, g, ctx, 1, ASSIGN_DEFAULT);
    CUgraphNode n;
    check("an unknown conditional type", add_conditional(&n, g, NULL, 0, h, 3, 1, NULL),
          INVALID_VALUE);
    check("an if with three bodies", add_conditional(&n, g, NULL, 0, h, COND_IF, 3, NULL),
          INVALID_VALUE);
    check("a while with no body", add_conditional(&n, g, NULL, 0, h, COND_WHILE, 0, NULL),
          INVALID_VALUE);
    check("a handle nobody created",
          add_conditional(&n, g, NULL, 0, h + 0x10000, COND_IF, 1, NULL), INVALID_VALUE);
    size_t count = 0;
    cuGraphGetNodes(g, NULL, &count);
    expect("refused nodes left nothing behind", count == 0);

    CUgraph *body;
    check("an if node", add_conditional(&n, g, NULL, 0, h, COND_IF, 1, &body), 0);
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CONDITIONAL_NODE;
    p.conditional.handle = h;
    p.conditional.size = 1;
    check("cuGraphNodeSetParams on a conditional node", cuGraphNodeSetParams(n, &p),
          INVALID_VALUE);

    /* Graphviz names the node. */
    char path[] = "/tmp/vgpu-conditional-dot-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    check("cuGraphDebugDotPrint", cuGraphDebugDotPrint(g, path, 0), 0);
    char text[4096] = {0};
    FILE *f = fopen(path, "r");
    if (f) {
        fread(text, 1, sizeof text - 1, f);
        fclose(f);
    }
    remove(path);
    expect("the dot print names the conditional node", strstr(text, "conditional") != NULL);

    /* Updating an executable graph's conditional node is not provided. */
    CUgraphExec e;
    cuGraphInstantiateWithFlags(&e, g, 0);
    cuGraphClone(&other, g);
    CUgraphNode err = NULL;
    int result = 0;
    cuGraphExecUpdate(e, other, &err, &result);
    expect("cuGraphExecUpdate: CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED",
           result == UPDATE_NOT_SUPPORTED);
    cuGraphExecDestroy(e);
    cuGraphDestroy(other);

    /* A body runs device work only. */
    CUDA_HOST_NODE_PARAMS hp = {host_fn, NULL};
    check("a host node added to a body", cuGraphAddHostNode(&n, body[0], NULL, 0, &hp), 0);
    check("instantiating a body with a host node", cuGraphInstantiateWithFlags(&e, g, 0),
          NOT_SUPPORTED);
    cuGraphDestroy(g);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CONDITIONALS_PTX_FILE\n", argv[0]);
        return 100;
    }
    CUdevice dev;
    CUmodule m;
    check("cuInit", cuInit(0), 0);
    cuDeviceGet(&dev, 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    check("cuModuleLoad (PTX calling cudaGraphSetConditional)", cuModuleLoad(&m, argv[1]), 0);
    cuModuleGetFunction(&set_handle, m, "set_handle");
    cuModuleGetFunction(&add_one, m, "add_one");
    cuModuleGetFunction(&count_down, m, "count_down");
    check("cuMemAlloc", cuMemAlloc_v2(&cells, 4 * sizeof(int)), 0);

    void *fn = NULL;
    int found = 0;
    check("cuGetProcAddress: cuGraphConditionalHandleCreate",
          cuGetProcAddress_v2("cuGraphConditionalHandleCreate", &fn, 12030, 0, &found), 0);
    expect("found for CUDA 12.3 callers", found == 0 && fn == (void *)cuGraphConditionalHandleCreate);
    check("cuGetProcAddress for CUDA 12.0 callers",
          cuGetProcAddress_v2("cuGraphConditionalHandleCreate", &fn, 12000, 0, &found),
          NOT_FOUND);
    expect("... a version not sufficient", found == VERSION_NOT_SUFFICIENT);

    while_loop();
    if_else(7);
    if_else(0);
    for (unsigned v = 0; v <= 3; v++) nested_switch(v);
    heap_in_body();
    refusals();

    /* A kernel that sets a handle outside any graph launch fails its own context. */
    CUcontext other;
    cuCtxCreate_v2(&other, 0, dev);
    CUmodule m2;
    CUfunction set2;
    cuModuleLoad(&m2, argv[1]);
    cuModuleGetFunction(&set2, m2, "set_handle");
    CUgraphConditionalHandle forged = 0x1234;
    unsigned one = 1;
    void *args[] = {&forged, &one};
    cuLaunchKernel(set2, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    check("cudaGraphSetConditional outside a graph launch", cuCtxSynchronize(),
          ILLEGAL_INSTRUCTION);
    cuCtxDestroy_v2(other);
    cuCtxSetCurrent(ctx);
    int v[4] = {1, 2, 3, 4};
    put(v);
    get(v);
    check("the first context carries on", cuCtxSynchronize(), 0);
    expect("and its memory is intact", same(v, 1, 2, 3, 4));
    cuMemFree_v2(cells);
    cuCtxDestroy_v2(ctx);
    printf("%d failures\n", failures);
    return failures;
}
