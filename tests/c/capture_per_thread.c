/*
 * Stream capture of the per-thread default stream, as programs built with
 * `--default-stream per-thread` (or CUDA_API_PER_THREAD_DEFAULT_STREAM) make it: through the
 * `_ptsz` entry points with stream 0, through the base entry points with CU_STREAM_PER_THREAD,
 * and through the entry points cuGetProcAddress hands out for the per-thread default stream.
 * Each capture records a fill and a device-to-device copy, its graph runs, and the bytes are
 * checked; two threads capture their own per-thread streams at once; the legacy stream still
 * cannot be captured. (Before, the per-thread names were missing, and a capture begun on
 * CU_STREAM_PER_THREAD never saw the work sent to it.)
 *
 * Prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of failures.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuStreamIsCapturing_ptsz(CUstream, int *);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream, int *, unsigned long long *, CUgraph *,
                                        const CUgraphNode **, size_t *);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

#include "check.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define WORDS 256

static CUcontext ctx;

/* The entry points a capture uses, in one of three forms. */
struct api {
    const char *name;
    CUstream stream;
    CUresult (*begin)(CUstream, int);
    CUresult (*is_capturing)(CUstream, int *);
    CUresult (*fill)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*end)(CUstream, CUgraph *);
    CUresult (*launch)(CUgraphExec, CUstream);
    CUresult (*sync)(CUstream);
};

/* Captures a fill of `a` with `value` and a copy of `a` to `b` on the form's per-thread
 * stream, runs the graph and checks `b`. */
static void capture_round(const struct api *f, unsigned value) {
    char line[200];
    CUdeviceptr a, b;
    check("buffers", cuMemAlloc_v2(&a, WORDS * 4) | cuMemAlloc_v2(&b, WORDS * 4), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: begin", f->name);
    check(line, f->begin(f->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    int status = -1;
    snprintf(line, sizeof line, "%s: is capturing", f->name);
    check(line, f->is_capturing(f->stream, &status), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: the status is active", f->name);
    expect(line, status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    snprintf(line, sizeof line, "%s: fill", f->name);
    check(line, f->fill(a, value, WORDS, f->stream), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: copy", f->name);
    check(line, f->copy(b, a, WORDS * 4, f->stream), CUDA_SUCCESS);
    CUgraph g = NULL;
    snprintf(line, sizeof line, "%s: end", f->name);
    check(line, f->end(f->stream, &g), CUDA_SUCCESS);
    size_t n = 0;
    check("nodes", cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: the graph has the fill and the copy (%zu nodes)", f->name, n);
    expect(line, n == 2);
    status = -1;
    f->is_capturing(f->stream, &status);
    snprintf(line, sizeof line, "%s: no longer capturing", f->name);
    expect(line, status == CU_STREAM_CAPTURE_STATUS_NONE);
    static __thread unsigned host[WORDS];
    memset(host, 0, sizeof host);
    check("the copy's destination is read before", cuMemcpyDtoH_v2(host, b, sizeof host),
          CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: nothing ran during the capture", f->name);
    expect(line, host[0] != value);
    CUgraphExec e;
    check("instantiate", cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: launch", f->name);
    check(line, f->launch(e, f->stream), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: synchronize", f->name);
    check(line, f->sync(f->stream), CUDA_SUCCESS);
    check("read back", cuMemcpyDtoH_v2(host, b, sizeof host), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: the graph filled and copied", f->name);
    expect(line, host[0] == value && host[WORDS - 1] == value);
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
}

static void *proc(const char *name) {
    void *fn = NULL;
    int status = -1;
    CUresult r = cuGetProcAddress_v2(name, &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                     &status);
    if (r != CUDA_SUCCESS || !fn) {
        printf("FAIL cuGetProcAddress_v2(%s): %d\n", name, r);
        failures++;
    }
    return fn;
}

static struct api ptsz = {"_ptsz with stream 0",           NULL,
                          cuStreamBeginCapture_v2_ptsz,    cuStreamIsCapturing_ptsz,
                          cuMemsetD32Async_ptsz,           cuMemcpyDtoDAsync_v2_ptsz,
                          cuStreamEndCapture_ptsz,         cuGraphLaunch_ptsz,
                          cuStreamSynchronize_ptsz};
static struct api named = {"CU_STREAM_PER_THREAD",     CU_STREAM_PER_THREAD,
                           cuStreamBeginCapture_v2,    cuStreamIsCapturing,
                           cuMemsetD32Async,           cuMemcpyDtoDAsync_v2,
                           cuStreamEndCapture,         cuGraphLaunch,
                           cuStreamSynchronize};

static void *thread_main(void *arg) {
    cuCtxSetCurrent(ctx);
    capture_round(&ptsz, (unsigned)(size_t)arg);
    return NULL;
}

int main(void) {
    CUdevice dev;
    check("cuInit", cuInit(0), CUDA_SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), CUDA_SUCCESS);

    capture_round(&ptsz, 0x11111111u);
    capture_round(&named, 0x22222222u);
    struct api looked_up = {
        "cuGetProcAddress per-thread forms with stream 0",
        NULL,
        (CUresult(*)(CUstream, int))proc("cuStreamBeginCapture"),
        (CUresult(*)(CUstream, int *))proc("cuStreamIsCapturing"),
        (CUresult(*)(CUdeviceptr, unsigned, size_t, CUstream))proc("cuMemsetD32Async"),
        (CUresult(*)(CUdeviceptr, CUdeviceptr, size_t, CUstream))proc("cuMemcpyDtoDAsync"),
        (CUresult(*)(CUstream, CUgraph *))proc("cuStreamEndCapture"),
        (CUresult(*)(CUgraphExec, CUstream))proc("cuGraphLaunch"),
        (CUresult(*)(CUstream))proc("cuStreamSynchronize"),
    };
    if (!failures) capture_round(&looked_up, 0x33333333u);

    /* Information through the per-thread form while a capture is active. */
    check("begin for the information", cuStreamBeginCapture_v2_ptsz(NULL, 1), CUDA_SUCCESS);
    int status = -1;
    unsigned long long id = 0;
    check("cuStreamGetCaptureInfo_v2_ptsz",
          cuStreamGetCaptureInfo_v2_ptsz(NULL, &status, &id, NULL, NULL, NULL), CUDA_SUCCESS);
    expect("an active capture with an id", status == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
    CUgraph g;
    check("end it", cuStreamEndCapture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);
    cuGraphDestroy(g);

    /* Two threads capture their own per-thread default streams at once. */
    pthread_t t1, t2;
    pthread_create(&t1, NULL, thread_main, (void *)0x44444444ul);
    pthread_create(&t2, NULL, thread_main, (void *)0x55555555ul);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);

    /* The legacy default stream still cannot be captured. */
    check("the legacy stream is refused", cuStreamBeginCapture_v2(NULL, 1),
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    printf("%d failures\n", failures);
    return failures;
}
