/*
 * Green contexts (CUDA 12.4): the device's SM resource is split, a descriptor of one piece makes
 * a green context, and the kernels of that context's streams run on its multiprocessors only:
 * each block writes %smid and %nsmid, which on the simulated GPU are the execution unit it ran
 * on and how many the launch could use. Run against a simulated GPU of 8 units (compute
 * capability 8.0: groups of at least 2 SMs, in twos, under CUDA 13's rules). A context created
 * with an execution affinity (an SM count) runs its kernels on its SMs the same way.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures.
 */
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

/* CUDA 12.9's CUdevResource (144 bytes; CUDA 13 has the same size and smCount offset). */
typedef struct {
    int type;
    unsigned char internal[92];
    union {
        struct {
            unsigned smCount;
        } sm;
        unsigned char oversize[48];
    };
} CUdevResource;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuCtxCreate_v3(CUcontext *, void *, int, unsigned, CUdevice);
CUresult cuCtxGetExecAffinity(void *, int);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuDeviceGetDevResource(CUdevice, CUdevResource *, int);
CUresult cuCtxGetDevResource(CUcontext, CUdevResource *, int);
CUresult cuGreenCtxGetDevResource(CUgreenCtx, CUdevResource *, int);
CUresult cuStreamGetDevResource(CUstream, CUdevResource *, int);
CUresult cuDevSmResourceSplitByCount(CUdevResource *, unsigned *, const CUdevResource *,
                                     CUdevResource *, unsigned, unsigned);
CUresult cuDevSmResourceSplit(CUdevResource *, unsigned, const CUdevResource *, CUdevResource *,
                              unsigned, void *);
CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *, CUdevResource *, unsigned);
CUresult cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
CUresult cuGreenCtxDestroy(CUgreenCtx);
CUresult cuCtxFromGreenCtx(CUcontext *, CUgreenCtx);
CUresult cuGreenCtxStreamCreate(CUstream *, CUgreenCtx, unsigned, int);
CUresult cuStreamGetGreenCtx(CUstream, CUgreenCtx *);
CUresult cuStreamGetCtx_v2(CUstream, CUcontext *, CUgreenCtx *);
CUresult cuGreenCtxRecordEvent(CUgreenCtx, CUevent);
CUresult cuGreenCtxWaitEvent(CUgreenCtx, CUevent);
CUresult cuGreenCtxGetId(CUgreenCtx, unsigned long long *);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventSynchronize(CUevent);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

#include "check.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_INVALID_RESOURCE_TYPE 914
#define CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION 915
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEV_RESOURCE_TYPE_SM 1
#define CU_GREEN_CTX_DEFAULT_STREAM 1
#define CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING 1
#define CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE 2
#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DISABLE_TIMING 2
#define SMS 8
#define BLOCKS 64

static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry smids(.param .u64 out)\n{\n .reg .u32 %r<4>;\n .reg .u64 %rd<4>;\n"
    " ld.param.u64 %rd1, [out];\n mov.u32 %r1, %ctaid.x;\n mov.u32 %r2, %smid;\n"
    " mov.u32 %r3, %nsmid;\n mul.wide.u32 %rd2, %r1, 8;\n add.u64 %rd3, %rd1, %rd2;\n"
    " st.global.v2.u32 [%rd3], {%r2, %r3};\n ret;\n}\n";

/* Launches `smids` on `s` in the current context; 1 if every block saw `units` units and ran on
 * one of them. */
static int ran_on(CUfunction f, CUstream s, CUdeviceptr out, unsigned units) {
    unsigned host[BLOCKS * 2];
    void *args[] = {&out};
    if (cuMemsetD32_v2(out, 0xffffffffu, BLOCKS * 2) != CUDA_SUCCESS) return 0;
    if (cuLaunchKernel(f, BLOCKS, 1, 1, 32, 1, 1, 0, s, args, NULL) != CUDA_SUCCESS) return 0;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 0;
    if (cuMemcpyDtoH_v2(host, out, sizeof host) != CUDA_SUCCESS) return 0;
    for (int b = 0; b < BLOCKS; b++) {
        if (host[2 * b + 1] != units || host[2 * b] >= units) {
            printf("  block %d: %%smid %u, %%nsmid %u, want %u units\n", b, host[2 * b],
                   host[2 * b + 1], units);
            return 0;
        }
    }
    return 1;
}

int main(void) {
    void *fn = NULL;
    int found = -1;
    check("cuGetProcAddress: cuGreenCtxCreate for CUDA 12.4",
          cuGetProcAddress_v2("cuGreenCtxCreate", &fn, 12040, 0, &found), CUDA_SUCCESS);
    expect("... is the exported function", found == 0 && fn == (void *)cuGreenCtxCreate);
    check("cuGetProcAddress: cuGreenCtxStreamCreate for CUDA 12.4 callers",
          cuGetProcAddress_v2("cuGreenCtxStreamCreate", &fn, 12040, 0, &found),
          CUDA_ERROR_NOT_FOUND);
    expect("... a version not sufficient", found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    CUdevice dev;
    int sms = 0;
    check("cuInit", cuInit(0), CUDA_SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    check("SM count", cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
          CUDA_SUCCESS);
    expect("the simulated GPU of this test has 8 units", sms == SMS);
    CUcontext primary;
    check("the primary context", cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    check("... current", cuCtxSetCurrent(primary), CUDA_SUCCESS);

    /* The device's SMs. */
    CUdevResource all, groups[4], rest;
    memset(&all, 0, sizeof all);
    expect("CUdevResource is 144 bytes", sizeof all == 144);
    check("cuDeviceGetDevResource", cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_SUCCESS);
    expect("... the device's SMs", all.type == CU_DEV_RESOURCE_TYPE_SM && all.sm.smCount == SMS);
    check("a resource type there is none of", cuDeviceGetDevResource(dev, &rest, 2),
          CUDA_ERROR_INVALID_RESOURCE_TYPE);
    check("a NULL resource", cuDeviceGetDevResource(dev, NULL, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_ERROR_INVALID_VALUE);

    /* Splits. */
    unsigned n = 0;
    check("a split's group count (at least 1 SM asked)",
          cuDevSmResourceSplitByCount(NULL, &n, &all, NULL, 0, 1), CUDA_SUCCESS);
    expect("... four groups of 2 (compute capability 8's minimum)", n == 4);
    n = 4;
    check("the split", cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 3), CUDA_SUCCESS);
    expect("... two groups of 4, nothing left",
           n == 2 && groups[0].sm.smCount == 4 && groups[1].sm.smCount == 4 &&
               rest.type == CU_DEV_RESOURCE_TYPE_SM && rest.sm.smCount == 0);
    CUdevResource fine[4], fine_rest;
    n = 4;
    check("a split ignoring co-scheduling",
          cuDevSmResourceSplitByCount(fine, &n, &all, &fine_rest,
                                      CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 3),
          CUDA_SUCCESS);
    expect("... two groups of 3, two SMs left",
           n == 2 && fine[1].sm.smCount == 3 && fine_rest.sm.smCount == 2);
    n = 1;
    check("one group wanted", cuDevSmResourceSplitByCount(fine, &n, &all, NULL, 0, 0),
          CUDA_SUCCESS);
    expect("... one made, of 2", n == 1 && fine[0].sm.smCount == 2);
    n = 4;
    check("a group split again", cuDevSmResourceSplitByCount(fine, &n, &groups[0], NULL, 0, 1),
          CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    check("more SMs asked than there are",
          cuDevSmResourceSplitByCount(fine, &n, &all, NULL, 0, SMS + 1), CUDA_ERROR_INVALID_VALUE);
    check("clusters on compute capability 8.0",
          cuDevSmResourceSplitByCount(fine, &n, &all, NULL,
                                      CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE, 4),
          CUDA_ERROR_INVALID_VALUE);
    n = 0;
    check("room for no group", cuDevSmResourceSplitByCount(fine, &n, &all, NULL, 0, 4),
          CUDA_ERROR_INVALID_VALUE);
    CUdevResource forged = all;
    memset(forged.internal, 0, sizeof forged.internal);
    n = 4;
    check("a resource vgpu did not write",
          cuDevSmResourceSplitByCount(fine, &n, &forged, NULL, 0, 4), CUDA_ERROR_INVALID_VALUE);

    /* CUDA 13's structured split: 4 SMs, then the rest discovered. */
    struct {
        unsigned smCount, coscheduledSmCount, preferredCoscheduledSmCount, flags, localityDomainId;
        unsigned reserved[11];
    } params[2];
    memset(params, 0, sizeof params);
    expect("CU_DEV_SM_RESOURCE_GROUP_PARAMS is 64 bytes", sizeof params[0] == 64);
    params[0].smCount = 4;
    CUdevResource structured[2], structured_rest;
    check("cuDevSmResourceSplit", cuDevSmResourceSplit(structured, 2, &all, &structured_rest, 0, params),
          CUDA_SUCCESS);
    expect("... 4 SMs and the other 4 discovered, none left",
           structured[0].sm.smCount == 4 && structured[1].sm.smCount == 4 &&
               params[1].smCount == 4 && structured_rest.type == 0);
    params[0].smCount = 3;
    check("an odd count", cuDevSmResourceSplit(structured, 2, &all, NULL, 0, params),
          CUDA_ERROR_INVALID_VALUE);
    params[0].smCount = 8;
    params[1].smCount = 0;
    check("a discovered group of none", cuDevSmResourceSplit(structured, 2, &all, NULL, 0, params),
          CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    check("... discovered without results",
          cuDevSmResourceSplit(NULL, 2, &all, NULL, 0, params), CUDA_SUCCESS);
    expect("... as 0", params[1].smCount == 0);
    params[0].smCount = 4;
    check("cuDevSmResourceSplit again", cuDevSmResourceSplit(structured, 2, &all, NULL, 0, params),
          CUDA_SUCCESS);

    /* Descriptors. */
    CUdevResourceDesc desc, both, whole;
    check("a descriptor of one group", cuDevResourceGenerateDesc(&desc, &groups[0], 1),
          CUDA_SUCCESS);
    check("a descriptor of both groups", cuDevResourceGenerateDesc(&both, groups, 2),
          CUDA_SUCCESS);
    check("a descriptor of the whole device", cuDevResourceGenerateDesc(&whole, &all, 1),
          CUDA_SUCCESS);
    CUdevResource mixed[2] = {groups[0], fine_rest};
    check("pieces of two splits", cuDevResourceGenerateDesc(&desc, mixed, 2),
          CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    check("a remainder of no SMs", cuDevResourceGenerateDesc(&desc, &rest, 1),
          CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    check("no resources", cuDevResourceGenerateDesc(&desc, groups, 0), CUDA_ERROR_INVALID_VALUE);
    check("the descriptor of one group again", cuDevResourceGenerateDesc(&desc, &groups[0], 1),
          CUDA_SUCCESS);

    /* Green contexts. */
    CUgreenCtx g = NULL, g8 = NULL;
    check("cuGreenCtxCreate without the default stream flag", cuGreenCtxCreate(&g, desc, dev, 0),
          CUDA_ERROR_INVALID_VALUE);
    check("a descriptor vgpu did not make",
          cuGreenCtxCreate(&g, (CUdevResourceDesc)&all, dev, CU_GREEN_CTX_DEFAULT_STREAM),
          CUDA_ERROR_INVALID_VALUE);
    check("cuGreenCtxCreate", cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM),
          CUDA_SUCCESS);
    check("one of both groups", cuGreenCtxCreate(&g8, both, dev, CU_GREEN_CTX_DEFAULT_STREAM),
          CUDA_SUCCESS);
    CUdevResourceDesc sdesc;
    CUgreenCtx gs4 = NULL;
    check("a descriptor of a structured group", cuDevResourceGenerateDesc(&sdesc, &structured[1], 1),
          CUDA_SUCCESS);
    check("a green context of it", cuGreenCtxCreate(&gs4, sdesc, dev, CU_GREEN_CTX_DEFAULT_STREAM),
          CUDA_SUCCESS);
    check("... its resource", cuGreenCtxGetDevResource(gs4, &rest, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_SUCCESS);
    expect("... 4 SMs", rest.sm.smCount == 4);
    check("... destroyed", cuGreenCtxDestroy(gs4), CUDA_SUCCESS);
    CUcontext cur = NULL;
    check("cuCtxGetCurrent", cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    expect("... creating it changed nothing current", cur == primary);
    CUcontext gctx = NULL;
    check("cuCtxFromGreenCtx", cuCtxFromGreenCtx(&gctx, g), CUDA_SUCCESS);
    expect("... a context of its own", gctx != NULL && gctx != primary && (void *)gctx != (void *)g);
    CUdevResource r;
    check("cuGreenCtxGetDevResource", cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_SUCCESS);
    expect("... its 4 SMs", r.sm.smCount == 4);
    check("cuCtxGetDevResource of its context",
          cuCtxGetDevResource(gctx, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    expect("... its 4 SMs", r.sm.smCount == 4);
    check("cuCtxGetDevResource of the primary context",
          cuCtxGetDevResource(primary, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    expect("... all 8", r.sm.smCount == SMS);
    check("a green context's resource splits again",
          cuGreenCtxGetDevResource(g8, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    n = 4;
    check("... into groups", cuDevSmResourceSplitByCount(fine, &n, &r, NULL, 0, 4), CUDA_SUCCESS);
    expect("... two of 4", n == 2);
    unsigned long long id = 0, id8 = 0;
    check("cuGreenCtxGetId", cuGreenCtxGetId(g, &id), CUDA_SUCCESS);
    check("cuGreenCtxGetId (other)", cuGreenCtxGetId(g8, &id8), CUDA_SUCCESS);
    expect("... distinct", id != 0 && id != id8);

    /* Streams. */
    CUstream gs = NULL;
    check("cuGreenCtxStreamCreate without CU_STREAM_NON_BLOCKING",
          cuGreenCtxStreamCreate(&gs, g, 0, 0), CUDA_ERROR_INVALID_VALUE);
    check("cuGreenCtxStreamCreate", cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0),
          CUDA_SUCCESS);
    CUgreenCtx got = NULL;
    check("cuStreamGetGreenCtx", cuStreamGetGreenCtx(gs, &got), CUDA_SUCCESS);
    expect("... the green context", got == g);
    check("cuStreamGetGreenCtx of the primary's legacy stream", cuStreamGetGreenCtx(NULL, &got),
          CUDA_SUCCESS);
    expect("... none", got == NULL);
    CUcontext sc = NULL;
    check("cuStreamGetCtx_v2", cuStreamGetCtx_v2(gs, &sc, &got), CUDA_SUCCESS);
    expect("... the primary context and the green one", sc == primary && got == g);
    check("cuStreamGetDevResource", cuStreamGetDevResource(gs, &r, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_SUCCESS);
    expect("... the green context's 4 SMs", r.sm.smCount == 4);

    /* Kernels: the green context's run on its 4 units, the primary context's on all 8. */
    CUdeviceptr out, kept;
    CUmodule pm, gm;
    CUfunction pf, gf;
    check("out buffer", cuMemAlloc_v2(&out, BLOCKS * 8), CUDA_SUCCESS);
    check("module (primary)", cuModuleLoadData(&pm, PTX), CUDA_SUCCESS);
    check("kernel (primary)", cuModuleGetFunction(&pf, pm, "smids"), CUDA_SUCCESS);
    check("the green context current", cuCtxSetCurrent(gctx), CUDA_SUCCESS);
    check("module (green)", cuModuleLoadData(&gm, PTX), CUDA_SUCCESS);
    check("kernel (green)", cuModuleGetFunction(&gf, gm, "smids"), CUDA_SUCCESS);
    expect("the green context's kernel runs on its 4 units", ran_on(gf, gs, out, 4));
    expect("... on its legacy stream too", ran_on(gf, NULL, out, 4));
    check("memory allocated in the green context", cuMemAlloc_v2(&kept, 4), CUDA_SUCCESS);
    check("... filled", cuMemsetD32_v2(kept, 0x600d, 1), CUDA_SUCCESS);
    check("cuCtxDestroy of a green context's context", cuCtxDestroy_v2(gctx),
          CUDA_ERROR_INVALID_CONTEXT);
    check("the primary context current", cuCtxSetCurrent(primary), CUDA_SUCCESS);
    expect("the primary context's kernel runs on all 8 units", ran_on(pf, NULL, out, SMS));

    /* Events of the primary context record and hold the green context's work. */
    CUevent ev;
    check("an event of the primary context", cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING),
          CUDA_SUCCESS);
    check("cuGreenCtxRecordEvent", cuGreenCtxRecordEvent(g, ev), CUDA_SUCCESS);
    check("... completes", cuEventSynchronize(ev), CUDA_SUCCESS);
    check("cuGreenCtxWaitEvent", cuGreenCtxWaitEvent(g, ev), CUDA_SUCCESS);

    /* Execution affinity: a context created with 3 SMs gets 4 (compute capability 8's twos) and
     * runs its kernels on them. */
    struct {
        int type;
        unsigned val;
    } affinity = {0, 3};
    CUcontext actx = NULL;
    CUmodule am;
    CUfunction af;
    check("cuCtxCreate_v3 with an SM count of 3", cuCtxCreate_v3(&actx, &affinity, 1, 0, dev),
          CUDA_SUCCESS);
    affinity.val = 0;
    check("cuCtxGetExecAffinity", cuCtxGetExecAffinity(&affinity, 0), CUDA_SUCCESS);
    expect("... 4 SMs", affinity.type == 0 && affinity.val == 4);
    check("cuCtxGetDevResource of it", cuCtxGetDevResource(actx, &r, CU_DEV_RESOURCE_TYPE_SM),
          CUDA_SUCCESS);
    expect("... 4 SMs", r.sm.smCount == 4);
    check("module (affinity)", cuModuleLoadData(&am, PTX), CUDA_SUCCESS);
    check("kernel (affinity)", cuModuleGetFunction(&af, am, "smids"), CUDA_SUCCESS);
    CUdeviceptr aout;
    check("its out buffer", cuMemAlloc_v2(&aout, BLOCKS * 8), CUDA_SUCCESS);
    expect("its kernel runs on 4 units", ran_on(af, NULL, aout, 4));
    check("its memory freed", cuMemFree_v2(aout), CUDA_SUCCESS);
    check("cuCtxDestroy of it", cuCtxDestroy_v2(actx), CUDA_SUCCESS);
    check("the primary context current again", cuCtxSetCurrent(primary), CUDA_SUCCESS);

    /* Destroy. */
    check("cuStreamDestroy of its stream", cuStreamDestroy_v2(gs), CUDA_SUCCESS);
    check("cuGreenCtxDestroy", cuGreenCtxDestroy(g), CUDA_SUCCESS);
    check("... twice", cuGreenCtxDestroy(g), CUDA_ERROR_INVALID_HANDLE);
    check("cuCtxFromGreenCtx after it", cuCtxFromGreenCtx(&gctx, g), CUDA_ERROR_INVALID_HANDLE);
    check("a context handle as a green context", cuGreenCtxDestroy((CUgreenCtx)primary),
          CUDA_ERROR_INVALID_HANDLE);
    unsigned word = 0;
    check("its memory is the primary context's", cuMemcpyDtoH_v2(&word, kept, 4), CUDA_SUCCESS);
    expect("... with its bytes", word == 0x600d);
    check("... and freed there", cuMemFree_v2(kept), CUDA_SUCCESS);
    check("cuGreenCtxDestroy (other)", cuGreenCtxDestroy(g8), CUDA_SUCCESS);
    check("out freed", cuMemFree_v2(out), CUDA_SUCCESS);
    check("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2(dev), CUDA_SUCCESS);
    printf("%d failures\n", failures);
    return failures;
}
