/*
 * gpu-task: small CUDA driver-API jobs for the end-to-end tests in VMs.
 *
 * An ordinary CUDA program: it links against libcuda.so.1 (-lcuda), which in
 * a vgpu guest is the guest shim installed by guest-shim/install.sh. No CUDA
 * headers are needed; the few prototypes are declared here (cuda.h ABI, API
 * version 12).
 *
 *   gpu-task info
 *       prints the device and the memory slice
 *   gpu-task alloc MIB EXPECT
 *       cuMemAlloc(MIB MiB) must return the CUresult EXPECT; on success the
 *       memory is written with cuMemsetD8, a part read back and checked
 *   gpu-task saxpy PTX N ROUNDS
 *       loads the saxpy kernel from PTX and runs it ROUNDS times on N floats,
 *       checking the result on the CPU after every round
 *   gpu-task hold MIB SECONDS [PTX]
 *       allocates MIB MiB and keeps it for SECONDS (0: until killed); with
 *       PTX it is busy meanwhile: saxpy rounds back to back, each checked;
 *       SIGTERM or SIGINT ends the hold early, in an orderly way
 *
 * Output lines start with "GPU-TASK " (the tests match them):
 *   GPU-TASK info name="..." total=<bytes> free=<bytes>
 *   GPU-TASK alloc mib=<n> result=<code> <name>
 *   GPU-TASK saxpy n=<n> rounds=<r> ok
 *   GPU-TASK holding mib=<n> ptr=0x... pid=<pid>
 *   GPU-TASK progress rounds=<r>          (about once a second while busy)
 *   GPU-TASK hold done rounds=<r>
 *   GPU-TASK FAIL <what>                  (exit 1)
 * Exit status: 0 all good, 1 a call failed or a result was wrong, 2 usage.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PREFIX "GPU-TASK"
#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define MIB (1024UL * 1024UL)
#define BLOCK 256
#define SAXPY_A 2.0f
#define CHECK_BYTES 4096
#define PROGRESS_NS 1000000000LL
#define NAME_LEN 256
/* y grows by a*x each round; it is reset before it leaves the range where
 * floats hold integers exactly (2^24), so every round can be checked exactly. */
#define RESET_ROUNDS 1024

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t count);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuModuleLoadData(CUmodule *mod, const void *image);
CUresult cuModuleGetFunction(CUfunction *fn, CUmodule mod, const char *name);
CUresult cuLaunchKernel(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);
CUresult cuGetErrorName(CUresult r, const char **name);

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static const char *err_name(CUresult r)
{
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != 0 || name == NULL)
        return "?";
    return name;
}

static void fail(const char *what, CUresult r)
{
    printf(PREFIX " FAIL %s: %d %s\n", what, r, err_name(r));
    exit(EXIT_FAIL);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != 0)                                                                               \
            fail(#call, r_);                                                                       \
    } while (0)

static void usage(void)
{
    fprintf(stderr, "usage: gpu-task info | alloc MIB EXPECT | saxpy PTX N ROUNDS | hold MIB SECONDS [PTX]\n");
    exit(EXIT_USAGE);
}

static long parse_num(const char *s)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < 0)
        usage();
    return v;
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        printf(PREFIX " FAIL cannot open %s\n", path);
        exit(EXIT_FAIL);
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    fclose(f);
    if (buf == NULL) {
        printf(PREFIX " FAIL out of host memory\n");
        exit(EXIT_FAIL);
    }
    buf[len] = '\0';
    return buf;
}

/* A saxpy job: y = a*x + y on n floats, x[i] = i, y starts at 1. */
struct saxpy {
    CUfunction fn;
    int n;
    CUdeviceptr x, y;
    float *host;
    long rounds;      /* rounds run in total */
    long since_reset; /* rounds since y was last set to 1 */
};

static void saxpy_reset_y(struct saxpy *s)
{
    for (int i = 0; i < s->n; i++)
        s->host[i] = 1.0f;
    CHECK(cuMemcpyHtoD_v2(s->y, s->host, sizeof(float) * (size_t)s->n));
    s->since_reset = 0;
}

static void saxpy_init(struct saxpy *s, const char *ptx_path, int n)
{
    CUmodule mod;
    char *ptx = read_file(ptx_path);
    CHECK(cuModuleLoadData(&mod, ptx));
    free(ptx);
    CHECK(cuModuleGetFunction(&s->fn, mod, "saxpy"));
    s->n = n;
    s->rounds = 0;
    s->since_reset = 0;
    s->host = malloc(sizeof(float) * (size_t)n);
    if (s->host == NULL)
        fail("malloc", 0);
    size_t bytes = sizeof(float) * (size_t)n;
    CHECK(cuMemAlloc_v2(&s->x, bytes));
    CHECK(cuMemAlloc_v2(&s->y, bytes));
    for (int i = 0; i < n; i++)
        s->host[i] = (float)i;
    CHECK(cuMemcpyHtoD_v2(s->x, s->host, bytes));
    saxpy_reset_y(s);
}

/* One round: launch, synchronize, read back and check every element. */
static void saxpy_round(struct saxpy *s)
{
    float a = SAXPY_A;
    if (s->since_reset == RESET_ROUNDS)
        saxpy_reset_y(s);
    void *params[] = {&s->n, &a, &s->x, &s->y};
    unsigned grid = (unsigned)((s->n + BLOCK - 1) / BLOCK);
    CHECK(cuLaunchKernel(s->fn, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    s->rounds++;
    s->since_reset++;
    CHECK(cuMemcpyDtoH_v2(s->host, s->y, sizeof(float) * (size_t)s->n));
    for (int i = 0; i < s->n; i++) {
        float want = 1.0f + SAXPY_A * (float)i * (float)s->since_reset;
        if (s->host[i] != want) {
            printf(PREFIX " FAIL saxpy round %ld: y[%d] = %g, expected %g\n", s->rounds, i,
                   (double)s->host[i], (double)want);
            exit(EXIT_FAIL);
        }
    }
}

static int cmd_info(void)
{
    CUdevice dev;
    char name[NAME_LEN];
    size_t free_b = 0, total_b = 0;
    setup();
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf(PREFIX " info name=\"%s\" total=%zu free=%zu\n", name, total_b, free_b);
    return 0;
}

static int cmd_alloc(long mib, long expect)
{
    CUdeviceptr p = 0;
    setup();
    CUresult r = cuMemAlloc_v2(&p, (size_t)mib * MIB);
    printf(PREFIX " alloc mib=%ld result=%d %s\n", mib, r, err_name(r));
    if (r != (CUresult)expect) {
        printf(PREFIX " FAIL cuMemAlloc returned %d (%s), expected %ld\n", r, err_name(r), expect);
        return EXIT_FAIL;
    }
    if (r == 0) {
        unsigned char back[CHECK_BYTES];
        size_t bytes = (size_t)mib * MIB;
        CHECK(cuMemsetD8_v2(p, 0x5a, bytes));
        size_t off = bytes > sizeof back ? bytes - sizeof back : 0;
        size_t len = bytes - off;
        CHECK(cuMemcpyDtoH_v2(back, p + off, len));
        for (size_t i = 0; i < len; i++) {
            if (back[i] != 0x5a) {
                printf(PREFIX " FAIL byte %zu of the allocation reads %#x\n", off + i, back[i]);
                return EXIT_FAIL;
            }
        }
        CHECK(cuMemFree_v2(p));
    }
    return 0;
}

static int cmd_saxpy(const char *ptx, long n, long rounds)
{
    struct saxpy s;
    if (n <= 0 || n > (1 << 24))
        usage();
    setup();
    saxpy_init(&s, ptx, (int)n);
    for (long i = 0; i < rounds; i++)
        saxpy_round(&s);
    printf(PREFIX " saxpy n=%ld rounds=%ld ok\n", n, rounds);
    return 0;
}

static int cmd_hold(long mib, long seconds, const char *ptx)
{
    CUdeviceptr p = 0;
    struct saxpy s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    setup();
    CHECK(cuMemAlloc_v2(&p, (size_t)mib * MIB));
    CHECK(cuMemsetD8_v2(p, 0x11, (size_t)mib * MIB));
    if (ptx != NULL)
        saxpy_init(&s, ptx, BLOCK * 4);
    CHECK(cuCtxSynchronize());
    printf(PREFIX " holding mib=%ld ptr=%#llx pid=%d\n", mib, p, (int)getpid());
    fflush(stdout);
    long long end = seconds > 0 ? now_ns() + seconds * 1000000000LL : 0;
    long long next_report = now_ns() + PROGRESS_NS;
    long rounds = 0;
    while (!stop_requested && (end == 0 || now_ns() < end)) {
        if (ptx == NULL) {
            usleep(100000);
            continue;
        }
        saxpy_round(&s);
        rounds = s.rounds;
        if (now_ns() >= next_report) {
            printf(PREFIX " progress rounds=%ld\n", rounds);
            fflush(stdout);
            next_report += PROGRESS_NS;
        }
    }
    CHECK(cuMemFree_v2(p));
    printf(PREFIX " hold done rounds=%ld\n", rounds);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        usage();
    if (strcmp(argv[1], "info") == 0 && argc == 2)
        return cmd_info();
    if (strcmp(argv[1], "alloc") == 0 && argc == 4)
        return cmd_alloc(parse_num(argv[2]), parse_num(argv[3]));
    if (strcmp(argv[1], "saxpy") == 0 && argc == 5)
        return cmd_saxpy(argv[2], parse_num(argv[3]), parse_num(argv[4]));
    if (strcmp(argv[1], "hold") == 0 && (argc == 4 || argc == 5))
        return cmd_hold(parse_num(argv[2]), parse_num(argv[3]), argc == 5 ? argv[4] : NULL);
    usage();
    return EXIT_USAGE;
}
