/*
 * Synchronizing calls of one thread do not stop the process's other threads: while threads
 * wait in cuStreamSynchronize, cuEventSynchronize and cuCtxSynchronize for a stream held by a
 * cuStreamWaitValue32, or in synchronous copies (cuMemcpyDtoH, cuMemcpyHtoD) behind the legacy
 * stream held so (and cuMemsetD32, cuMemcpyDtoD, which vgpud answers once done), or in cuMemFree (which waits for the process's earlier work), another thread's
 * calls (copies, fills, synchronizations of another stream) go on and complete, and that thread's cuStreamWriteValue32 releases the waits, as on CUDA. Before, a waiting thread held the process's connection to vgpud and the program never
 * ended. The same for the calls that wait for earlier work before they release something:
 * cuCtxDestroy of another context, cuMemFreeHost of a mapped (DEVICEMAP) buffer,
 * cuMemHostUnregister of a range a copy queued behind the wait writes into (its bytes arrive),
 * cuModuleUnload, and cuMemFreeAsync of memory not from a pool.
 * Also: more waiting threads than the shim keeps connections for, and an error of the awaited
 * work reaching the waiting thread.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures. A deadlock ends the program through alarm() with a FAIL line.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostUnregister(void *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamWaitValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuStreamWriteValue32_v2(CUstream, CUdeviceptr, unsigned, unsigned);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

#include "check.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CU_STREAM_NON_BLOCKING 1
#define CU_STREAM_WAIT_VALUE_GEQ 0
#define CU_EVENT_DISABLE_TIMING 2
#define CU_MEMHOSTALLOC_DEVICEMAP 2

/* Threads waiting at once in the second check: more than the shim keeps idle connections for
 * (4), so some of them open connections of their own and give them back. */
#define WAITERS 8
/* Round trips the main thread makes while the others wait. */
#define CALLS 100
/* Words of the buffer the main thread fills and reads back. */
#define WORDS 1024

enum kind {
    STREAM,
    EVENT,
    CONTEXT,
    COPY_DTOH,
    COPY_HTOD,
    FILL,
    COPY_DTOD,
    MEM_FREE,
    CTX_DESTROY,
    FREE_HOST_MAPPED,
    HOST_UNREGISTER,
    MODULE_UNLOAD,
    FREE_ASYNC
};
static const char *kind_name[] = {"cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize",
                                  "cuMemcpyDtoH",        "cuMemcpyHtoD",       "cuMemsetD32",
                                  "cuMemcpyDtoD",        "cuMemFree",
                                  "cuCtxDestroy",        "cuMemFreeHost",      "cuMemHostUnregister",
                                  "cuModuleUnload",      "cuMemFreeAsync"};
/* What the copy waiters read (COPY_DTOH, filled before) and write (COPY_HTOD). */
#define READ_PATTERN 0x5a5a5a5au
#define WRITE_PATTERN 0x77777777u
/* A wrong copy's result. */
#define WRONG_BYTES 999

static CUcontext ctx;
static CUdeviceptr read_buf, write_buf, fill_buf, dtod_buf;
/* What the MEM_FREE waiter frees (cuMemFree waits for the process's earlier work). */
static CUdeviceptr victim;
/* What the CTX_DESTROY waiter destroys, the FREE_HOST_MAPPED waiter frees, and the range the
 * HOST_UNREGISTER waiter copies into (behind the wait) and unregisters. */
static CUcontext doomed;
static void *mapped_host;
/* What the MODULE_UNLOAD waiter unloads; what the FREE_ASYNC waiter frees on the other stream. */
static CUmodule unloaded;
static CUdeviceptr freed_async;
static CUstream other_stream;
#define REGISTERED_BYTES (64 * 1024)
static unsigned *registered;

struct waiter {
    pthread_t thread;
    enum kind kind;
    CUstream stream;
    CUevent event;
    atomic_int done;
    CUresult result;
};

static void *wait_main(void *arg) {
    struct waiter *w = arg;
    cuCtxSetCurrent(ctx);
    static __thread unsigned host[WORDS];
    switch (w->kind) {
    case STREAM: w->result = cuStreamSynchronize(w->stream); break;
    case EVENT: w->result = cuEventSynchronize(w->event); break;
    case CONTEXT: w->result = cuCtxSynchronize(); break;
    case COPY_DTOH:
        w->result = cuMemcpyDtoH_v2(host, read_buf, sizeof host);
        if (w->result == CUDA_SUCCESS &&
            (host[0] != READ_PATTERN || host[WORDS - 1] != READ_PATTERN))
            w->result = WRONG_BYTES;
        break;
    case COPY_HTOD:
        for (int i = 0; i < WORDS; i++) host[i] = WRITE_PATTERN;
        w->result = cuMemcpyHtoD_v2(write_buf, host, sizeof host);
        break;
    case FILL: w->result = cuMemsetD32_v2(fill_buf, WRITE_PATTERN, WORDS); break;
    case COPY_DTOD: w->result = cuMemcpyDtoD_v2(dtod_buf, read_buf, WORDS * 4); break;
    case MEM_FREE: w->result = cuMemFree_v2(victim); break;
    case CTX_DESTROY: w->result = cuCtxDestroy_v2(doomed); break;
    case FREE_HOST_MAPPED: w->result = cuMemFreeHost(mapped_host); break;
    case MODULE_UNLOAD: w->result = cuModuleUnload(unloaded); break;
    case FREE_ASYNC: w->result = cuMemFreeAsync(freed_async, other_stream); break;
    case HOST_UNREGISTER:
        w->result = cuMemcpyDtoHAsync_v2(registered, read_buf, WORDS * 4, w->stream);
        if (w->result == CUDA_SUCCESS) w->result = cuMemHostUnregister(registered);
        break;
    }
    atomic_store(&w->done, 1);
    return NULL;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL the program deadlocked: a waiting thread stopped the others\n";
    if (write(1, m, sizeof m - 1) < 0) {}
    _exit(99);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The main thread's work while others wait: fills on its own stream, synchronized and read
 * back (with a synchronous copy unless the legacy stream is the one held), CALLS times.
 * Returns the number of round trips that failed or read wrong bytes. */
static int work_beside(CUstream s2, CUdeviceptr buf, int legacy_held) {
    static unsigned host[WORDS];
    int bad = 0;
    for (unsigned i = 0; i < CALLS; i++) {
        if (cuMemsetD32Async(buf, i + 1, WORDS, s2) != CUDA_SUCCESS) bad++;
        if (cuStreamSynchronize(s2) != CUDA_SUCCESS) bad++;
        memset(host, 0, sizeof host);
        if (legacy_held) {
            if (cuMemcpyDtoHAsync_v2(host, buf, sizeof host, s2) != CUDA_SUCCESS) bad++;
            if (cuStreamSynchronize(s2) != CUDA_SUCCESS) bad++;
        } else if (cuMemcpyDtoH_v2(host, buf, sizeof host) != CUDA_SUCCESS) {
            bad++;
        }
        if (host[0] != i + 1 || host[WORDS - 1] != i + 1) bad++;
    }
    return bad;
}

/* Waits up to `seconds` for every waiter to be done; whether they all were. */
static int joined(struct waiter *w, int n, double seconds) {
    double until = now_s() + seconds;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= atomic_load(&w[i].done);
        if (all) break;
        if (now_s() > until) return 0;
        usleep(1000);
    }
    for (int i = 0; i < n; i++) pthread_join(w[i].thread, NULL);
    return 1;
}

static int any_done(struct waiter *w, int n) {
    for (int i = 0; i < n; i++)
        if (atomic_load(&w[i].done)) return 1;
    return 0;
}

/* Holds s1 at a wait for `flag`, starts `n` waiters of the given kinds, works beside them on
 * s2, then releases s1 from s2 and checks that every waiter returned `want`. */
static void round_of(const char *what, enum kind *kinds, int n, CUstream s1, CUstream s2,
                     CUevent ev, CUdeviceptr flag, CUdeviceptr buf, CUfunction after,
                     CUresult want) {
    char line[256];
    struct waiter w[WAITERS];
    memset(w, 0, sizeof w);
    check("the flag is cleared", cuMemsetD32_v2(flag, 0, 1), CUDA_SUCCESS);
    check("the stream waits for the flag",
          cuStreamWaitValue32_v2(s1, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    if (after) {
        CUdeviceptr null_ptr = 0;
        void *params[] = {&null_ptr};
        check("a faulting kernel is queued behind the wait",
              cuLaunchKernel(after, 1, 1, 1, 1, 1, 1, 0, s1, params, NULL), CUDA_SUCCESS);
    }
    check("an event is recorded behind the wait", cuEventRecord(ev, s1), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        w[i].kind = kinds[i];
        w[i].stream = s1;
        w[i].event = ev;
        pthread_create(&w[i].thread, NULL, wait_main, &w[i]);
    }
    /* Long enough for the waiters to be past vgpud's wait in place (1 ms). */
    usleep(100 * 1000);
    double t0 = now_s();
    int bad = work_beside(s2, buf, s1 == NULL);
    double took = now_s() - t0;
    snprintf(line, sizeof line, "%s: %d round trips of another thread complete while they wait",
             what, CALLS);
    expect(line, bad == 0);
    printf("# %s: %d round trips beside the waiters took %.1f ms\n", what, CALLS, took * 1e3);
    /* cuMemHostUnregister need not wait (a range vgpud does not share has nothing to wait for),
     * nor cuMemFreeAsync (CUDA frees in stream order). */
    if (kinds[0] != HOST_UNREGISTER && kinds[0] != FREE_ASYNC) {
        snprintf(line, sizeof line, "%s: no waiter returned before the flag was written", what);
        expect(line, !any_done(w, n));
    }
    snprintf(line, sizeof line, "%s: the awaited stream is still not ready", what);
    check(line, cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
    snprintf(line, sizeof line, "%s: another thread's write releases the wait", what);
    check(line, cuStreamWriteValue32_v2(s2, flag, 1, 0), CUDA_SUCCESS);
    snprintf(line, sizeof line, "%s: every waiter returns", what);
    int all = joined(w, n, 30.0);
    expect(line, all);
    if (!all) return;
    for (int i = 0; i < n; i++) {
        snprintf(line, sizeof line, "%s: waiter %d (%s) returns what its work did", what, i,
                 kind_name[w[i].kind]);
        check(line, w[i].result, want);
    }
}

static const char FAULT_PTX[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry store_to(.param .u64 p)\n"
    "{\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %rd<2>;\n"
    "    ld.param.u64 %rd1, [p];\n"
    "    mov.u32 %r1, 7;\n"
    "    st.global.u32 [%rd1], %r1;\n"
    "    ret;\n"
    "}\n";

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(120);
    CUdevice dev;
    check("cuInit", cuInit(0), CUDA_SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), CUDA_SUCCESS);
    CUstream s1, s2;
    CUevent ev;
    CUdeviceptr flag, buf;
    check("stream 1", cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    check("stream 2", cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    check("event", cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    check("flag", cuMemAlloc_v2(&flag, 4), CUDA_SUCCESS);
    check("buffer", cuMemAlloc_v2(&buf, WORDS * 4), CUDA_SUCCESS);
    check("copy source", cuMemAlloc_v2(&read_buf, WORDS * 4), CUDA_SUCCESS);
    check("copy destination", cuMemAlloc_v2(&write_buf, WORDS * 4), CUDA_SUCCESS);
    check("fill destination", cuMemAlloc_v2(&fill_buf, WORDS * 4), CUDA_SUCCESS);
    check("device copy destination", cuMemAlloc_v2(&dtod_buf, WORDS * 4), CUDA_SUCCESS);

    /* One waiter of each kind, one at a time. */
    for (int k = STREAM; k <= CONTEXT; k++) {
        enum kind kinds[] = {(enum kind)k};
        round_of(kind_name[k], kinds, 1, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);
    }

    /* Synchronous copies behind the legacy stream, held the same way. */
    check("the copies' source is filled", cuMemsetD32_v2(read_buf, READ_PATTERN, WORDS),
          CUDA_SUCCESS);
    for (int k = COPY_DTOH; k <= COPY_DTOD; k++) {
        enum kind kinds[] = {(enum kind)k};
        round_of(kind_name[k], kinds, 1, NULL, s2, ev, flag, buf, NULL, CUDA_SUCCESS);
    }
    static unsigned written[WORDS];
    check("the copy's bytes are read back", cuMemcpyDtoH_v2(written, write_buf, sizeof written),
          CUDA_SUCCESS);
    expect("the waiting copy wrote its bytes",
           written[0] == WRITE_PATTERN && written[WORDS - 1] == WRITE_PATTERN);
    check("the fill's bytes are read back", cuMemcpyDtoH_v2(written, fill_buf, sizeof written),
          CUDA_SUCCESS);
    expect("the waiting fill wrote its bytes",
           written[0] == WRITE_PATTERN && written[WORDS - 1] == WRITE_PATTERN);
    check("the device copy's bytes are read back",
          cuMemcpyDtoH_v2(written, dtod_buf, sizeof written), CUDA_SUCCESS);
    expect("the waiting device copy wrote its bytes",
           written[0] == READ_PATTERN && written[WORDS - 1] == READ_PATTERN);

    /* cuMemFree, which waits for all the process's earlier work (the held stream's too). */
    check("memory to free", cuMemAlloc_v2(&victim, 4096), CUDA_SUCCESS);
    enum kind free_kind[] = {MEM_FREE};
    round_of(kind_name[MEM_FREE], free_kind, 1, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);

    /* cuCtxDestroy of another context and cuMemFreeHost of a mapped buffer, which wait for the
     * process's earlier work too. */
    check("a context to destroy", cuCtxCreate_v2(&doomed, 0, dev), CUDA_SUCCESS);
    check("the first context is current again", cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    enum kind destroy_kind[] = {CTX_DESTROY};
    round_of(kind_name[CTX_DESTROY], destroy_kind, 1, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);
    check("a mapped buffer", cuMemHostAlloc(&mapped_host, 4096, CU_MEMHOSTALLOC_DEVICEMAP),
          CUDA_SUCCESS);
    enum kind free_host_kind[] = {FREE_HOST_MAPPED};
    round_of(kind_name[FREE_HOST_MAPPED], free_host_kind, 1, s1, s2, ev, flag, buf, NULL,
             CUDA_SUCCESS);

    /* cuModuleUnload (kernels of the module may still be queued) and cuMemFreeAsync of memory
     * from cuMemAlloc (on the stream that is not held). */
    check("a module to unload", cuModuleLoadData(&unloaded, FAULT_PTX), CUDA_SUCCESS);
    enum kind unload_kind[] = {MODULE_UNLOAD};
    round_of(kind_name[MODULE_UNLOAD], unload_kind, 1, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);
    check("memory to free in stream order", cuMemAlloc_v2(&freed_async, 4096), CUDA_SUCCESS);
    other_stream = s2;
    enum kind free_async_kind[] = {FREE_ASYNC};
    round_of(kind_name[FREE_ASYNC], free_async_kind, 1, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);

    /* cuMemHostUnregister of a range (whole pages of private memory, which the unix transport
     * shares with vgpud) that a copy queued behind the wait writes into. */
    registered = mmap(NULL, REGISTERED_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    expect("the range to register is mapped", registered != MAP_FAILED);
    memset(registered, 0, REGISTERED_BYTES);
    check("the range is registered", cuMemHostRegister_v2(registered, REGISTERED_BYTES, 0),
          CUDA_SUCCESS);
    enum kind unregister_kind[] = {HOST_UNREGISTER};
    round_of(kind_name[HOST_UNREGISTER], unregister_kind, 1, s1, s2, ev, flag, buf, NULL,
             CUDA_SUCCESS);
    check("the copied stream is done", cuStreamSynchronize(s1), CUDA_SUCCESS);
    expect("the copy queued behind the wait wrote the unregistered range",
           registered[0] == READ_PATTERN && registered[WORDS - 1] == READ_PATTERN);

    /* Many waiters at once, of every kind. */
    enum kind many[WAITERS];
    for (int i = 0; i < WAITERS; i++) many[i] = (enum kind)(i % 3);
    round_of("eight waiters", many, WAITERS, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);
    /* And again: the connections given back serve the next waits. */
    round_of("eight waiters again", many, WAITERS, s1, s2, ev, flag, buf, NULL, CUDA_SUCCESS);

    /* A wait that ends in a fault of the awaited work reports it to the waiting thread (last:
     * the fault ends the context). */
    CUmodule mod;
    CUfunction store_to;
    check("module", cuModuleLoadData(&mod, FAULT_PTX), CUDA_SUCCESS);
    check("kernel", cuModuleGetFunction(&store_to, mod, "store_to"), CUDA_SUCCESS);
    enum kind one[] = {STREAM};
    round_of("a fault behind the wait", one, 1, s1, s2, ev, flag, buf, store_to,
             CUDA_ERROR_ILLEGAL_ADDRESS);

    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
    printf("%d failures\n", failures);
    return failures;
}
