/*
 * Legacy interprocess memory (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle)
 * between processes of one VM, from a plain C program against vgpu's libcuda.so. The test
 * harness (tests/ipc.rs) runs it several times and passes the 64-byte handle as hex:
 *
 *   ipc export N         allocate N words, fill word i with i, print "handle HEX" and
 *                        "holding"; on a line of stdin check what the importer wrote
 *                        (word 0 = 0xC0FFEE, word i = i + 1), free the memory, print "freed";
 *                        on another line exit
 *   ipc import HEX N     open the handle (through cuGetProcAddress_v2), read it, run a kernel
 *                        on it, write to it; forged handles, double close; event handles
 *                        (plain events refused, forged and own handles refused)
 *   ipc open HEX CODE    open the handle, expecting CODE
 *   ipc hold HEX N       open the handle, print "holding"; on a line of stdin read it, run a
 *                        kernel on it, close it
 *   ipc evexport [spin]  export one word of memory (0) and an interprocess event, print
 *                        "handle HEX", "event HEX" and "holding"; its stream stops at a host
 *                        function until a line of stdin, then sets the word to MARK and records
 *                        the event; prints "released"; on another line exits. With "spin" the
 *                        stream stops at a kernel that spins for minutes instead (the harness
 *                        kills the process)
 *   ipc evimport HEX EV  open both; the event is not ready; a kernel incrementing the word runs
 *                        after cuStreamWaitEvent on it (print "waiting", then synchronize):
 *                        the word must be MARK + 1, not MARK (the kernel ran after the record)
 *   ipc evopen EV CODE   open the event handle, expecting CODE
 *   ipc evshare          export one word of memory (0) and an interprocess event it does not
 *                        record, print "handle HEX", "event HEX" and "holding"; on a line of
 *                        stdin (an importer recorded the event meanwhile) the event is not
 *                        ready; a kernel incrementing the word runs after cuStreamWaitEvent on
 *                        it (print "waiting", then synchronize): the word must be MARK2 + 1
 *                        (the kernel ran after the importer's record)
 *   ipc evrecord HEX EV  open both; record the opened event behind a host function that sets
 *                        nothing and waits for a line of stdin, after which the stream sets the
 *                        word to MARK2 (print "recorded" before); prints "released" once its
 *                        stream ran; on another line exits
 *   ipc evsyncdie EV     open the event, print "waiting" and block in cuEventSynchronize (the
 *                        harness kills the process meanwhile)
 *   ipc evorphan HEX EV  open both, wait on the event in a stream, print "waiting" and
 *                        cuEventSynchronize: the exporter is killed meanwhile, so every wait
 *                        ends with CUDA_ERROR_INVALID_HANDLE
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef struct { unsigned char reserved[64]; } CUipcMemHandle;
typedef struct { unsigned char reserved[64]; } CUipcEventHandle;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuIpcGetEventHandle(CUipcEventHandle *, CUevent);
CUresult cuIpcOpenEventHandle(CUevent *, CUipcEventHandle);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventQuery(CUevent);
CUresult cuEventSynchronize(CUevent);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchHostFunc(CUstream, void (*)(void *), void *);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuGetErrorName(CUresult, const char **);

#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_NOT_READY 600
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_EVENT_INTERPROCESS 4
#define MARK 0xC0FFEEu
#define MARK2 0xBEEF00u

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

static void setup(void) {
    CUcontext ctx;
    CUmodule mod;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuModuleLoadData(&mod, INC_PTX) ||
        cuModuleGetFunction(&inc_fn, mod, "inc")) {
        printf("FAIL setup\n");
        exit(100);
    }
}

static CUresult inc(CUdeviceptr p, unsigned n) {
    void *args[] = {&p, &n};
    CUresult r = cuLaunchKernel(inc_fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL);
    return r ? r : cuCtxSynchronize();
}

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(failures + 50);
}

static CUipcMemHandle parse(const char *hex) {
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 64 && hex[2 * i] && hex[2 * i + 1]; i++)
        sscanf(hex + 2 * i, "%2hhx", &h.reserved[i]);
    return h;
}

static unsigned *read_words(CUdeviceptr p, unsigned n) {
    unsigned *w = calloc(n, 4);
    check("read the shared memory", cuMemcpyDtoH_v2(w, p, (size_t)n * 4), 0);
    return w;
}

static void export_mem(unsigned n) {
    CUdeviceptr d = 0;
    check("cuMemAlloc", cuMemAlloc_v2(&d, (size_t)n * 4), 0);
    unsigned *w = malloc((size_t)n * 4);
    for (unsigned i = 0; i < n; i++) w[i] = i;
    check("fill", cuMemcpyHtoD_v2(d, w, (size_t)n * 4), 0);
    CUipcMemHandle h, again, inner;
    check("cuIpcGetMemHandle", cuIpcGetMemHandle(&h, d), 0);
    check("cuIpcGetMemHandle again", cuIpcGetMemHandle(&again, d), 0);
    check("cuIpcGetMemHandle inside the allocation", cuIpcGetMemHandle(&inner, d + 64), 0);
    expect("one allocation has one handle",
           !memcmp(&h, &again, sizeof h) && !memcmp(&h, &inner, sizeof h));
    int raw = 0;
    for (int i = 0; i + 8 <= 64; i++) raw |= !memcmp(h.reserved + i, &d, 8);
    expect("the handle does not carry the device address", !raw);
    CUipcMemHandle none;
    check("cuIpcGetMemHandle of memory that is not allocated",
          cuIpcGetMemHandle(&none, 0x1000), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr own = 0;
    check("opening in the exporting process",
          cuIpcOpenMemHandle_v2(&own, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
          CUDA_ERROR_INVALID_CONTEXT);
    printf("handle ");
    for (int i = 0; i < 64; i++) printf("%02x", h.reserved[i]);
    printf("\nholding\n");
    fflush(stdout);
    wait_line();
    unsigned *r = read_words(d, n);
    int same = r[0] == MARK;
    for (unsigned i = 1; i < n; i++) same &= r[i] == i + 1;
    expect("the exporter sees the importer's kernel and copy", same);
    check("cuMemFree of exported memory", cuMemFree_v2(d), 0);
    check("its handle is gone from this process", cuIpcGetMemHandle(&again, d),
          CUDA_ERROR_INVALID_VALUE);
    printf("freed\n");
    fflush(stdout);
    wait_line();
}

static void import_mem(const char *hex, unsigned n) {
    CUipcMemHandle h = parse(hex);
    CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned) = NULL;
    int status = -1;
    check("cuGetProcAddress_v2(cuIpcOpenMemHandle)",
          cuGetProcAddress_v2("cuIpcOpenMemHandle", (void **)&open_fn, 12000, 0, &status), 0);
    expect("it is found", open_fn != NULL && status == 0);
    if (!open_fn) return;
    CUdeviceptr p = 0, q = 0;
    check("cuIpcOpenMemHandle", open_fn(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), 0);
    CUdeviceptr base = 0;
    size_t size = 0;
    check("cuMemGetAddressRange of opened memory", cuMemGetAddressRange_v2(&base, &size, p + 8), 0);
    expect("the range is the exported allocation", base == p && size == (size_t)n * 4);
    unsigned *w = read_words(p, n);
    int same = 1;
    for (unsigned i = 0; i < n; i++) same &= w[i] == i;
    expect("the importer reads the exporter's data", same);
    check("a kernel on opened memory", inc(p, n), 0);
    unsigned mark = MARK;
    check("a copy into opened memory", cuMemcpyHtoD_v2(p, &mark, 4), 0);
    unsigned *r = read_words(p, n);
    expect("the kernel changed it", r[0] == MARK && r[n - 1] == n);
    check("cuMemFree of opened memory", cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle re;
    check("re-exporting opened memory", cuIpcGetMemHandle(&re, p), CUDA_ERROR_INVALID_VALUE);
    check("opening it again", cuIpcOpenMemHandle_v2(&q, h, 0), 0);
    expect("at the same address", q == p);
    check("close", cuIpcCloseMemHandle(p), 0);
    check("close the second opening", cuIpcCloseMemHandle(q), 0);
    check("a third close", cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    check("closed memory is out of reach", cuMemcpyHtoD_v2(p, &mark, 4),
          CUDA_ERROR_INVALID_VALUE);
    /* Forged handles: a changed token, someone else's bytes, bad flags. */
    CUipcMemHandle forged = h;
    forged.reserved[12] ^= 0x5a;
    check("a forged token", cuIpcOpenMemHandle_v2(&q, forged, 0), CUDA_ERROR_INVALID_HANDLE);
    CUipcMemHandle junk;
    memset(&junk, 0x41, sizeof junk);
    check("a handle vgpu did not make", cuIpcOpenMemHandle_v2(&q, junk, 0),
          CUDA_ERROR_INVALID_HANDLE);
    check("unknown flags", cuIpcOpenMemHandle_v2(&q, h, 0x10), CUDA_ERROR_INVALID_VALUE);
    /* Event handles: only interprocess events are exported; forged and own handles refused. */
    CUevent e, plain, opened;
    check("an interprocess event",
          cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS), 0);
    check("a plain event", cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING), 0);
    CUipcEventHandle eh;
    memset(&eh, 0, sizeof eh);
    check("cuIpcGetEventHandle of an event without CU_EVENT_INTERPROCESS",
          cuIpcGetEventHandle(&eh, plain), CUDA_ERROR_INVALID_HANDLE);
    check("cuIpcGetEventHandle", cuIpcGetEventHandle(&eh, e), 0);
    check("cuIpcOpenEventHandle in the exporting process", cuIpcOpenEventHandle(&opened, eh),
          CUDA_ERROR_INVALID_CONTEXT);
    CUipcEventHandle forged_e = eh;
    forged_e.reserved[12] ^= 0x5a;
    check("a forged event token", cuIpcOpenEventHandle(&opened, forged_e),
          CUDA_ERROR_INVALID_HANDLE);
    CUipcEventHandle as_event;
    memcpy(&as_event, &h, sizeof as_event);
    check("a memory handle as an event handle", cuIpcOpenEventHandle(&opened, as_event),
          CUDA_ERROR_INVALID_HANDLE);
}

static void open_only(const char *hex, int want) {
    CUdeviceptr p = 0;
    check("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2(&p, parse(hex), 0), want);
    if (want == 0) check("close", cuIpcCloseMemHandle(p), 0);
}

static void hold(const char *hex, unsigned n) {
    CUdeviceptr p = 0;
    check("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2(&p, parse(hex), 0), 0);
    printf("holding\n");
    fflush(stdout);
    wait_line();
    unsigned *r = read_words(p, n);
    expect("opened memory outlives the exporter's free", r[0] == MARK && r[n - 1] == n);
    check("a kernel on it", inc(p, n), 0);
    r = read_words(p, n);
    expect("the kernel changed it", r[0] == MARK + 1 && r[n - 1] == n + 1);
    check("close", cuIpcCloseMemHandle(p), 0);
}

static CUipcEventHandle parse_event(const char *hex) {
    CUipcMemHandle m = parse(hex);
    CUipcEventHandle e;
    memcpy(&e, &m, sizeof e);
    return e;
}

static void print_hex(const char *what, const unsigned char *b) {
    printf("%s ", what);
    for (int i = 0; i < 64; i++) printf("%02x", b[i]);
    printf("\n");
}

/* The exporter's host function: holds its stream until the harness says go. */
static void hold_stream(void *arg) {
    (void)arg;
    wait_line();
}

/* A kernel that spins for minutes on the simulated GPU (cancelled when its process dies). */
static const char SPIN_PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry spin(.param .u64 p)\n{\n .reg .pred %p; .reg .b64 %rd<4>;\n"
    " mov.u64 %rd1, 0;\nLOOP:\n add.u64 %rd1, %rd1, 1;\n setp.lt.u64 %p, %rd1, 4000000000;\n"
    " @%p bra LOOP;\n ld.param.u64 %rd2, [p]; cvta.to.global.u64 %rd3, %rd2;\n"
    " st.global.u64 [%rd3], %rd1;\n ret;\n}\n";

static void export_event(int spin) {
    CUdeviceptr d = 0;
    CUstream s;
    CUevent e;
    check("cuMemAlloc", cuMemAlloc_v2(&d, 4), 0);
    unsigned zero = 0;
    check("zero", cuMemcpyHtoD_v2(d, &zero, 4), 0);
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("an interprocess event",
          cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS), 0);
    CUipcMemHandle h;
    CUipcEventHandle eh;
    check("cuIpcGetMemHandle", cuIpcGetMemHandle(&h, d), 0);
    check("cuIpcGetEventHandle", cuIpcGetEventHandle(&eh, e), 0);
    if (spin) {
        CUmodule m;
        CUfunction f;
        CUdeviceptr scratch = 0;
        check("cuMemAlloc", cuMemAlloc_v2(&scratch, 8), 0);
        check("load the spinning kernel", cuModuleLoadData(&m, SPIN_PTX), 0);
        check("cuModuleGetFunction", cuModuleGetFunction(&f, m, "spin"), 0);
        void *args[] = {&scratch};
        check("the spinning kernel", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), 0);
    } else {
        check("the host function", cuLaunchHostFunc(s, hold_stream, NULL), 0);
    }
    check("set the word after it", cuMemsetD32Async(d, MARK, 1, s), 0);
    check("record the event after it", cuEventRecord(e, s), 0);
    check("its record is pending", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    print_hex("handle", h.reserved);
    print_hex("event", eh.reserved);
    printf("holding\n");
    fflush(stdout);
    if (spin) {
        /* Killed while its record waits behind the kernel. */
        wait_line();
        return;
    }
    check("the stream ran", cuStreamSynchronize(s), 0);
    printf("released\n");
    fflush(stdout);
    wait_line();
    unsigned w = 0;
    check("read", cuMemcpyDtoH_v2(&w, d, 4), 0);
    expect("the importer's kernel ran after the record", w == MARK + 1);
    check("destroy", cuEventDestroy_v2(e), 0);
    check("free", cuMemFree_v2(d), 0);
}

static void import_event(const char *hex, const char *evhex) {
    CUdeviceptr p = 0;
    CUevent e;
    CUstream s;
    check("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2(&p, parse(hex), 0), 0);
    CUresult (*open_fn)(CUevent *, CUipcEventHandle) = NULL;
    int status = -1;
    check("cuGetProcAddress_v2(cuIpcOpenEventHandle)",
          cuGetProcAddress_v2("cuIpcOpenEventHandle", (void **)&open_fn, 12000, 0, &status), 0);
    expect("it is found", open_fn != NULL && status == 0);
    if (!open_fn) return;
    check("cuIpcOpenEventHandle", open_fn(&e, parse_event(evhex)), 0);
    check("the exporter's record is pending here too", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("cuStreamWaitEvent on it", cuStreamWaitEvent(s, e, 0), 0);
    void *args[2];
    unsigned n = 1;
    args[0] = &p;
    args[1] = &n;
    check("a kernel after the wait", cuLaunchKernel(inc_fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL),
          0);
    check("still pending once the wait is in place", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    printf("waiting\n");
    fflush(stdout);
    check("the stream ran", cuStreamSynchronize(s), 0);
    unsigned w = 0;
    check("read", cuMemcpyDtoH_v2(&w, p, 4), 0);
    expect("the kernel ran after the exporter's record (MARK + 1)", w == MARK + 1);
    check("the event is done", cuEventQuery(e), 0);
    check("cuEventSynchronize", cuEventSynchronize(e), 0);
    check("destroy", cuEventDestroy_v2(e), 0);
    check("close", cuIpcCloseMemHandle(p), 0);
}

static void orphan_event(const char *hex, const char *evhex) {
    CUdeviceptr p = 0;
    CUevent e;
    CUstream s;
    check("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2(&p, parse(hex), 0), 0);
    check("cuIpcOpenEventHandle", cuIpcOpenEventHandle(&e, parse_event(evhex)), 0);
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("cuStreamWaitEvent on it", cuStreamWaitEvent(s, e, 0), 0);
    printf("waiting\n");
    fflush(stdout);
    check("cuEventSynchronize ends when the exporter is gone", cuEventSynchronize(e),
          CUDA_ERROR_INVALID_HANDLE);
    check("so does the stream's wait", cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    check("and the query", cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
    check("the context still works", cuCtxSynchronize(), 0);
    check("destroy", cuEventDestroy_v2(e), 0);
    check("close", cuIpcCloseMemHandle(p), 0);
}

/* Exports a word and an event that an importer records. */
static void share_event(void) {
    CUdeviceptr d = 0;
    CUstream s;
    CUevent e;
    check("cuMemAlloc", cuMemAlloc_v2(&d, 4), 0);
    unsigned zero = 0;
    check("zero", cuMemcpyHtoD_v2(d, &zero, 4), 0);
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("an interprocess event",
          cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS), 0);
    CUipcMemHandle h;
    CUipcEventHandle eh;
    check("cuIpcGetMemHandle", cuIpcGetMemHandle(&h, d), 0);
    check("cuIpcGetEventHandle", cuIpcGetEventHandle(&eh, e), 0);
    check("never recorded: done", cuEventQuery(e), 0);
    print_hex("handle", h.reserved);
    print_hex("event", eh.reserved);
    printf("holding\n");
    fflush(stdout);
    wait_line();
    check("the importer's record is pending here", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    check("cuStreamWaitEvent on it", cuStreamWaitEvent(s, e, 0), 0);
    void *args[2];
    unsigned n = 1;
    args[0] = &d;
    args[1] = &n;
    check("a kernel after the wait", cuLaunchKernel(inc_fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL),
          0);
    check("still pending once the wait is in place", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    printf("waiting\n");
    fflush(stdout);
    check("the stream ran", cuStreamSynchronize(s), 0);
    unsigned w = 0;
    check("read", cuMemcpyDtoH_v2(&w, d, 4), 0);
    expect("the kernel ran after the importer's record (MARK2 + 1)", w == MARK2 + 1);
    check("the event is done", cuEventQuery(e), 0);
    check("cuEventSynchronize", cuEventSynchronize(e), 0);
    check("destroy", cuEventDestroy_v2(e), 0);
    check("free", cuMemFree_v2(d), 0);
}

/* Records an opened event behind a host function. */
static void record_opened(const char *hex, const char *evhex) {
    CUdeviceptr p = 0;
    CUevent e;
    CUstream s;
    check("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2(&p, parse(hex), 0), 0);
    check("cuIpcOpenEventHandle", cuIpcOpenEventHandle(&e, parse_event(evhex)), 0);
    check("cuStreamCreate", cuStreamCreate(&s, 0), 0);
    check("the host function", cuLaunchHostFunc(s, hold_stream, NULL), 0);
    check("set the word after it", cuMemsetD32Async(p, MARK2, 1, s), 0);
    check("record the opened event after it", cuEventRecord(e, s), 0);
    check("its record is pending", cuEventQuery(e), CUDA_ERROR_NOT_READY);
    printf("recorded\n");
    fflush(stdout);
    check("the stream ran", cuStreamSynchronize(s), 0);
    check("the record is done", cuEventQuery(e), 0);
    printf("released\n");
    fflush(stdout);
    wait_line();
    check("destroy", cuEventDestroy_v2(e), 0);
    check("close", cuIpcCloseMemHandle(p), 0);
}

int main(int argc, char **argv) {
    if ((argc == 2 || argc == 3) && !strcmp(argv[1], "evexport")) {
        setup();
        export_event(argc == 3 && !strcmp(argv[2], "spin"));
        return failures;
    }
    if (argc == 2 && !strcmp(argv[1], "evshare")) {
        setup();
        share_event();
        return failures;
    }
    if (argc < 3) return 2;
    setup();
    if (!strcmp(argv[1], "export")) export_mem((unsigned)strtoul(argv[2], NULL, 0));
    else if (!strcmp(argv[1], "import") && argc > 3)
        import_mem(argv[2], (unsigned)strtoul(argv[3], NULL, 0));
    else if (!strcmp(argv[1], "open") && argc > 3) open_only(argv[2], atoi(argv[3]));
    else if (!strcmp(argv[1], "evimport") && argc > 3) import_event(argv[2], argv[3]);
    else if (!strcmp(argv[1], "evopen") && argc > 3) {
        CUevent e;
        check("cuIpcOpenEventHandle", cuIpcOpenEventHandle(&e, parse_event(argv[2])),
              atoi(argv[3]));
    } else if (!strcmp(argv[1], "evorphan") && argc > 3) orphan_event(argv[2], argv[3]);
    else if (!strcmp(argv[1], "evrecord") && argc > 3) record_opened(argv[2], argv[3]);
    else if (!strcmp(argv[1], "evsyncdie")) {
        CUevent e;
        check("cuIpcOpenEventHandle", cuIpcOpenEventHandle(&e, parse_event(argv[2])), 0);
        printf("waiting\n");
        fflush(stdout);
        cuEventSynchronize(e);
        printf("FAIL cuEventSynchronize returned while its process was to be killed\n");
        return 1;
    }
    else if (!strcmp(argv[1], "hold") && argc > 3)
        hold(argv[2], (unsigned)strtoul(argv[3], NULL, 0));
    else return 2;
    return failures;
}
