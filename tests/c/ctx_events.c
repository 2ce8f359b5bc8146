/*
 * CUDA 12.5's context-wide events: cuCtxRecordEvent captures the work of every stream of a
 * context at the time of the call, and cuCtxWaitEvent makes every later piece of the
 * context's work (on its streams, its legacy stream and streams created afterwards) wait for an
 * event. Streams are held by cuStreamWaitValue32 and released by writes from another context of
 * the process, so every check is a fixed order of events, not timing.
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
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxRecordEvent(CUcontext, CUevent);
CUresult cuCtxWaitEvent(CUcontext, CUevent);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamWaitValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWriteValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventQuery(CUevent);
CUresult cuEventSynchronize(CUevent);

#include "check.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2
#define CU_STREAM_NON_BLOCKING 1
#define CU_STREAM_WAIT_VALUE_GEQ 0
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CU_EVENT_DISABLE_TIMING 2
#define WORDS 256

static CUcontext ctx, other;
static CUstream releaser;

/* Writes `value` to `word` from the other context (whose streams no wait of `ctx` holds). */
static void release(CUdeviceptr word, unsigned value) {
    cuCtxSetCurrent(other);
    check("the other context writes the word", cuStreamWriteValue32_v2(releaser, word, value, 0),
          CUDA_SUCCESS);
    check("... and synchronizes", cuStreamSynchronize(releaser), CUDA_SUCCESS);
    cuCtxSetCurrent(ctx);
}

static int filled_with(CUdeviceptr buf, unsigned value) {
    unsigned host[WORDS];
    if (cuMemcpyDtoH_v2(host, buf, sizeof host) != CUDA_SUCCESS) return 0;
    return host[0] == value && host[WORDS - 1] == value;
}

int main(void) {
    void *fn = NULL;
    int found = -1;
    check("cuGetProcAddress: cuCtxRecordEvent for CUDA 12.5",
          cuGetProcAddress_v2("cuCtxRecordEvent", &fn, 12050, 0, &found), CUDA_SUCCESS);
    expect("... is the exported function", found == 0 && fn == (void *)cuCtxRecordEvent);
    check("cuGetProcAddress: cuCtxWaitEvent for CUDA 12.4 callers",
          cuGetProcAddress_v2("cuCtxWaitEvent", &fn, 12040, 0, &found), CUDA_ERROR_NOT_FOUND);
    expect("... a version not sufficient", found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    CUdevice dev;
    check("cuInit", cuInit(0), CUDA_SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    check("the other context", cuCtxCreate_v2(&other, 0, dev), CUDA_SUCCESS);
    check("its stream", cuStreamCreate(&releaser, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent foreign;
    check("an event of the other context", cuEventCreate(&foreign, CU_EVENT_DISABLE_TIMING),
          CUDA_SUCCESS);
    check("the context", cuCtxCreate_v2(&ctx, 0, dev), CUDA_SUCCESS);
    CUstream s1, s2, s3;
    check("stream 1", cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    check("stream 2", cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr flag1, flag2, buf, buf2, buf3;
    check("flag 1", cuMemAlloc_v2(&flag1, 4), CUDA_SUCCESS);
    check("flag 2", cuMemAlloc_v2(&flag2, 4), CUDA_SUCCESS);
    check("buffer", cuMemAlloc_v2(&buf, WORDS * 4), CUDA_SUCCESS);
    check("buffer 2", cuMemAlloc_v2(&buf2, WORDS * 4), CUDA_SUCCESS);
    check("buffer 3", cuMemAlloc_v2(&buf3, WORDS * 4), CUDA_SUCCESS);
    check("flags cleared", cuMemsetD32_v2(flag1, 0, 1) | cuMemsetD32_v2(flag2, 0, 1),
          CUDA_SUCCESS);

    /* Record: both streams held, the event captures both. */
    CUevent all, held;
    check("event", cuEventCreate(&all, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    check("event 2", cuEventCreate(&held, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    check("stream 1 waits for flag 1",
          cuStreamWaitValue32_v2(s1, flag1, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    check("stream 2 waits for flag 2",
          cuStreamWaitValue32_v2(s2, flag2, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    check("cuCtxRecordEvent", cuCtxRecordEvent(ctx, all), CUDA_SUCCESS);
    check("the record waits for the held streams", cuEventQuery(all), CUDA_ERROR_NOT_READY);
    release(flag1, 1);
    check("stream 1 is done", cuStreamSynchronize(s1), CUDA_SUCCESS);
    check("the record still waits for stream 2", cuEventQuery(all), CUDA_ERROR_NOT_READY);
    release(flag2, 1);
    check("the record completes once both are done", cuEventSynchronize(all), CUDA_SUCCESS);
    check("a NULL context is the current one", cuCtxRecordEvent(NULL, all), CUDA_SUCCESS);
    check("... with nothing pending, done at once", cuEventSynchronize(all), CUDA_SUCCESS);
    check("an event of another context", cuCtxRecordEvent(ctx, foreign),
          CUDA_ERROR_INVALID_HANDLE);

    /* Wait: the context's later work, on every stream, waits for an event of a held stream.
     * Each stream fills a buffer of its own: streams 2 and 3 are not ordered with each other. */
    check("flag 1 cleared", cuMemsetD32_v2(flag1, 0, 1), CUDA_SUCCESS);
    check("the buffers are zero",
          cuMemsetD32_v2(buf, 0, WORDS) | cuMemsetD32_v2(buf2, 0, WORDS) |
              cuMemsetD32_v2(buf3, 0, WORDS),
          CUDA_SUCCESS);
    check("stream 1 waits for flag 1 again",
          cuStreamWaitValue32_v2(s1, flag1, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    check("an event behind it", cuEventRecord(held, s1), CUDA_SUCCESS);
    check("cuCtxWaitEvent", cuCtxWaitEvent(ctx, held), CUDA_SUCCESS);
    check("a fill on stream 2", cuMemsetD32Async(buf, 5, WORDS, s2), CUDA_SUCCESS);
    check("stream 2 waits for the event", cuStreamQuery(s2), CUDA_ERROR_NOT_READY);
    check("a stream created afterwards", cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING),
          CUDA_SUCCESS);
    check("a fill on it", cuMemsetD32Async(buf3, 6, WORDS, s3), CUDA_SUCCESS);
    check("it waits too", cuStreamQuery(s3), CUDA_ERROR_NOT_READY);
    check("a fill on the legacy stream", cuMemsetD32Async(buf2, 7, WORDS, NULL), CUDA_SUCCESS);
    check("the legacy stream waits too", cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    check("the other context is not held", cuCtxSetCurrent(other), CUDA_SUCCESS);
    check("... its stream is idle", cuStreamQuery(releaser), CUDA_SUCCESS);
    expect("nothing was filled yet (read from the other context)",
           filled_with(buf, 0) && filled_with(buf2, 0) && filled_with(buf3, 0));
    cuCtxSetCurrent(ctx);
    release(flag1, 2);
    check("stream 2 goes on", cuStreamSynchronize(s2), CUDA_SUCCESS);
    check("stream 3 goes on", cuStreamSynchronize(s3), CUDA_SUCCESS);
    check("the legacy stream goes on", cuStreamSynchronize(NULL), CUDA_SUCCESS);
    expect("the fills ran after the wait",
           filled_with(buf, 5) && filled_with(buf3, 6) && filled_with(buf2, 7));
    check("an event of another context may be waited for", cuCtxWaitEvent(ctx, foreign),
          CUDA_SUCCESS);

    /* A capturing stream: refused, and the capture invalidated. */
    CUgraph g;
    check("a capture begins", cuStreamBeginCapture_v2(s2, CU_STREAM_CAPTURE_MODE_RELAXED),
          CUDA_SUCCESS);
    check("cuCtxRecordEvent during a capture", cuCtxRecordEvent(ctx, all),
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    check("the capture was invalidated", cuStreamEndCapture(s2, &g),
          CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
    check("cuCtxDestroy (other)", cuCtxDestroy_v2(other), CUDA_SUCCESS);
    printf("%d failures\n", failures);
    return failures;
}
