/*
 * A guest program for the memory-policy tests (tests/memory_policy.rs): it
 * reads commands on stdin, one a line, and answers each with result lines
 * and then "done".
 *
 *   alloc COUNT BYTES   allocate COUNT buffers of BYTES, fill each with its
 *                       own pattern; prints "ptr 0x..." per buffer and
 *                       "ok alloc" or "FAIL alloc <i>: <CUresult>"
 *   check               read every buffer back through its pointer and
 *                       compare with the pattern, then run a kernel that adds
 *                       1 to every 64th word of each buffer and synchronise;
 *                       prints "ok check" or "FAIL check ..."
 *   free COUNT          free the last COUNT buffers
 *   try BYTES           one more allocation; prints "result <CUresult>" and
 *                       frees it again
 *   info                prints "info FREE TOTAL" (cuMemGetInfo)
 *   spin                queue a kernel that runs for minutes (not waited for)
 *   notify              register an over-budget notification callback
 *                       (cuDeviceRegisterAsyncNotification); prints "ok notify"
 *   notices             prints "notice BYTES" for each notification so far
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

/* add1(p, n): p[64 * i] += 1 for i < n. */
static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry add1(.param .u64 p, .param .u32 n)\n{\n"
    " .reg .pred %p; .reg .b32 %r<7>; .reg .b64 %rd<5>;\n"
    " ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];\n"
    " mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n"
    " mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    " setp.ge.u32 %p, %r5, %r1;\n @%p bra DONE;\n"
    " cvta.to.global.u64 %rd2, %rd1;\n mul.wide.u32 %rd3, %r5, 256;\n"
    " add.s64 %rd4, %rd2, %rd3;\n ld.global.u32 %r6, [%rd4];\n"
    " add.s32 %r6, %r6, 1;\n st.global.u32 [%rd4], %r6;\nDONE:\n ret;\n}\n"
    ".visible .entry spin(.param .u64 q)\n{\n .reg .pred %p; .reg .b64 %rd<2>;\n"
    " mov.u64 %rd1, 0;\nLOOP:\n add.u64 %rd1, %rd1, 1;\n setp.lt.u64 %p, %rd1, 4000000000;\n"
    " @%p bra LOOP;\n ret;\n}\n";

#define MAX_BUFS 256
#define STRIDE_WORDS 64

static CUdeviceptr bufs[MAX_BUFS];
static size_t sizes[MAX_BUFS];
static unsigned rounds[MAX_BUFS]; /* kernel passes each buffer has seen */
static int nbufs;
static CUfunction add1, spin;

static uint32_t pattern(int buf, size_t word) { return (uint32_t)(buf * 0x01000193u) ^ (uint32_t)word; }

static int setup(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuCtxCreate_v2(&ctx, 0, dev)) ||
        (r = cuModuleLoadData(&mod, PTX)) || (r = cuModuleGetFunction(&add1, mod, "add1")) ||
        (r = cuModuleGetFunction(&spin, mod, "spin"))) {
        printf("FAIL setup: %d\n", r);
        return 1;
    }
    return 0;
}

static void do_alloc(int count, size_t bytes) {
    uint32_t *host = malloc(bytes);
    for (int k = 0; k < count; k++) {
        if (nbufs == MAX_BUFS) {
            printf("FAIL alloc %d: too many buffers\n", k);
            break;
        }
        CUdeviceptr d;
        CUresult r = cuMemAlloc_v2(&d, bytes);
        if (r) {
            printf("FAIL alloc %d: %d\n", k, r);
            free(host);
            return;
        }
        for (size_t w = 0; w < bytes / 4; w++) host[w] = pattern(nbufs, w);
        if ((r = cuMemcpyHtoD_v2(d, host, bytes))) {
            printf("FAIL alloc %d: copy %d\n", k, r);
            free(host);
            return;
        }
        bufs[nbufs] = d;
        sizes[nbufs] = bytes;
        rounds[nbufs] = 0;
        nbufs++;
        printf("ptr 0x%llx\n", d);
    }
    free(host);
    printf("ok alloc\n");
}

static void do_check(void) {
    for (int b = 0; b < nbufs; b++) {
        size_t words = sizes[b] / 4;
        uint32_t *host = malloc(sizes[b]);
        CUresult r = cuMemcpyDtoH_v2(host, bufs[b], sizes[b]);
        if (r) {
            printf("FAIL check: read of buffer %d at 0x%llx: %d\n", b, bufs[b], r);
            free(host);
            return;
        }
        for (size_t w = 0; w < words; w++) {
            uint32_t want = pattern(b, w) + (w % STRIDE_WORDS == 0 ? rounds[b] : 0);
            if (host[w] != want) {
                printf("FAIL check: buffer %d word %zu is %u, not %u\n", b, w, host[w], want);
                free(host);
                return;
            }
        }
        free(host);
        unsigned n = (unsigned)((words + STRIDE_WORDS - 1) / STRIDE_WORDS);
        void *args[] = {&bufs[b], &n};
        if ((r = cuLaunchKernel(add1, (n + 255) / 256, 1, 1, 256, 1, 1, 0, 0, args, 0))) {
            printf("FAIL check: launch on buffer %d: %d\n", b, r);
            return;
        }
        rounds[b]++;
    }
    CUresult r = cuCtxSynchronize();
    if (r) {
        printf("FAIL check: synchronize: %d\n", r);
        return;
    }
    printf("ok check\n");
}

/* CUasyncNotificationInfo, and what the callback was told. */
typedef struct {
    int type;
    unsigned long long bytesOverBudget;
} AsyncInfo;
typedef void (*AsyncCallback)(AsyncInfo *, void *, void *);
CUresult cuDeviceRegisterAsyncNotification(CUdevice, AsyncCallback, void *, void **);
#define MAX_NOTICES 64
#define OVER_BUDGET 1
static unsigned long long notices[MAX_NOTICES];
static int nnotices;
static int notice_tag;
static pthread_mutex_t notice_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_notice(AsyncInfo *info, void *user, void *handle) {
    (void)handle;
    pthread_mutex_lock(&notice_lock);
    if (info->type == OVER_BUDGET && user == &notice_tag && nnotices < MAX_NOTICES)
        notices[nnotices++] = info->bytesOverBudget;
    pthread_mutex_unlock(&notice_lock);
}

int main(void) {
    setvbuf(stdout, 0, _IOLBF, 0);
    if (setup()) return 1;
    printf("ready\n");
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        int count;
        unsigned long long bytes;
        if (sscanf(line, "alloc %d %llu", &count, &bytes) == 2) {
            do_alloc(count, (size_t)bytes);
        } else if (!strncmp(line, "check", 5)) {
            do_check();
        } else if (sscanf(line, "free %d", &count) == 1) {
            for (; count > 0 && nbufs > 0; count--) {
                CUresult r = cuMemFree_v2(bufs[--nbufs]);
                if (r) printf("FAIL free: %d\n", r);
            }
            printf("ok free\n");
        } else if (sscanf(line, "try %llu", &bytes) == 1) {
            CUdeviceptr d;
            CUresult r = cuMemAlloc_v2(&d, (size_t)bytes);
            printf("result %d\n", r);
            if (!r) cuMemFree_v2(d);
        } else if (!strncmp(line, "info", 4)) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo_v2(&f, &t);
            if (r) printf("FAIL info: %d\n", r);
            else printf("info %zu %zu\n", f, t);
        } else if (!strncmp(line, "spin", 4)) {
            CUdeviceptr p = nbufs ? bufs[0] : 0;
            void *args[] = {&p};
            CUresult r = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
            if (r) printf("FAIL spin: %d\n", r);
            else printf("ok spin\n");
        } else if (!strncmp(line, "notices", 7)) {
            pthread_mutex_lock(&notice_lock);
            for (int i = 0; i < nnotices; i++) printf("notice %llu\n", notices[i]);
            pthread_mutex_unlock(&notice_lock);
        } else if (!strncmp(line, "notify", 6)) {
            void *handle = NULL;
            CUresult r = cuDeviceRegisterAsyncNotification(0, on_notice, &notice_tag, &handle);
            if (r || !handle) printf("FAIL notify: %d\n", r);
            else printf("ok notify\n");
        } else {
            printf("FAIL unknown command: %s", line);
        }
        printf("done\n");
    }
    return 0;
}
