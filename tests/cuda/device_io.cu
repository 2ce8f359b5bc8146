// Device-side printf and assert through the CUDA runtime.
//
//   device_io          kernels printf known lines; the program captures its
//                      own stdout and stderr (fds 1 and 2) around the launch
//                      and checks every line arrived exactly once
//   device_io assert   a kernel hits a device assert: cudaDeviceSynchronize
//                      must return cudaErrorAssert (710), the error must be
//                      sticky, and the assertion message must be printed
//
// Self-checking: one `ok`/`FAIL` line per check, exit status 1 if anything
// failed.
#include "check.h"

#include <cassert>
#include <string>
#include <unistd.h>

#define BLOCKS 4
#define THREADS 64

__global__ void hello_per_block(int tag)
{
    if (threadIdx.x == 0)
        printf("device_io: block %d of %d says hello (tag %d)\n", blockIdx.x, gridDim.x, tag);
}

__global__ void printf_formats()
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        printf("device_io: fmt d=%d u=%u x=%x lld=%lld f=%.3f e=%.2e s=%s c=%c p=%%\n", -7, 42u,
               0xbeefu, -1234567890123LL, 3.14159f, 6.02e23, "str", 'Z');
    }
}

__global__ void printf_every_thread()
{
    // 32 lines from one warp, one per lane.
    printf("device_io: lane %02d\n", (int)threadIdx.x);
}

__global__ void check_values(const int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) assert(v[i] != 13);
}

// ------------------------------------------------------- output capture

struct Capture {
    int saved_out = -1, saved_err = -1;
    FILE *file = nullptr;

    bool begin()
    {
        fflush(stdout);
        fflush(stderr);
        file = tmpfile();
        if (!file) return false;
        saved_out = dup(1);
        saved_err = dup(2);
        return saved_out >= 0 && saved_err >= 0 && dup2(fileno(file), 1) >= 0 &&
               dup2(fileno(file), 2) >= 0;
    }

    std::string end()
    {
        fflush(stdout);
        fflush(stderr);
        dup2(saved_out, 1);
        dup2(saved_err, 2);
        close(saved_out);
        close(saved_err);
        std::string text;
        rewind(file);
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, file)) > 0) text.append(buf, got);
        fclose(file);
        return text;
    }
};

static int count_occurrences(const std::string &text, const std::string &needle)
{
    int count = 0;
    for (size_t pos = text.find(needle); pos != std::string::npos;
         pos = text.find(needle, pos + needle.size()))
        ++count;
    return count;
}

static void show(const std::string &text)
{
    printf("# captured %zu bytes:\n", text.size());
    size_t start = 0;
    while (start < text.size()) {
        size_t nl = text.find('\n', start);
        if (nl == std::string::npos) nl = text.size();
        printf("#   %s\n", text.substr(start, nl - start).c_str());
        start = nl + 1;
    }
}

// -------------------------------------------------------------- modes

static void run_printf()
{
    Capture cap;
    if (!cap.begin()) {
        report_fail("capture stdout/stderr", "tmpfile/dup failed");
        return;
    }
    hello_per_block<<<BLOCKS, THREADS>>>(1234);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    printf_formats<<<1, 32>>>();
    printf_every_thread<<<1, 32>>>();
    cudaError_t sync2 = cudaDeviceSynchronize();
    std::string text = cap.end();
    show(text);

    CHECK("printf kernel launches", launch == cudaSuccess, "%s (%d)", cudaGetErrorName(launch),
          (int)launch);
    CHECK("cudaDeviceSynchronize after printf", sync == cudaSuccess && sync2 == cudaSuccess,
          "%s (%d), %s (%d)", cudaGetErrorName(sync), (int)sync, cudaGetErrorName(sync2),
          (int)sync2);
    for (int b = 0; b < BLOCKS; ++b) {
        char line[128], what[160];
        snprintf(line, sizeof line, "device_io: block %d of %d says hello (tag %d)\n", b, BLOCKS,
                 1234);
        snprintf(what, sizeof what, "printf line from block %d arrives exactly once", b);
        int c = count_occurrences(text, line);
        CHECK(what, c == 1, "seen %d times", c);
    }
    // The order of hello lines (before the later kernels' lines) follows
    // synchronisation: every hello line precedes the format line.
    size_t last_hello = text.rfind("says hello");
    size_t fmt = text.find("device_io: fmt");
    CHECK("printf output of the first kernel comes before the second's",
          last_hello != std::string::npos && fmt != std::string::npos && last_hello < fmt,
          "hello at %zd, fmt at %zd", (ssize_t)last_hello, (ssize_t)fmt);

    const char *want_fmt =
        "device_io: fmt d=-7 u=42 x=beef lld=-1234567890123 f=3.142 e=6.02e+23 s=str c=Z p=%\n";
    int c = count_occurrences(text, want_fmt);
    CHECK("printf formats %d %u %x %lld %.3f %.2e %s %c %%", c == 1, "seen %d times", c);

    int lanes = 0;
    for (int l = 0; l < 32; ++l) {
        char line[64];
        snprintf(line, sizeof line, "device_io: lane %02d\n", l);
        lanes += count_occurrences(text, line) == 1;
    }
    CHECK("printf from all 32 lanes of a warp", lanes == 32, "%d of 32 lanes seen once", lanes);
    CHECK_CUDA("cudaGetLastError clean after printf", cudaGetLastError());
}

static void run_assert()
{
    const int n = 64;
    int host[n];
    for (int i = 0; i < n; ++i) host[i] = i;  // host[13] == 13 trips the assert
    int *d = nullptr;
    REQUIRE(cudaMalloc(&d, sizeof host));
    REQUIRE(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));

    Capture cap;
    if (!cap.begin()) {
        report_fail("capture stdout/stderr", "tmpfile/dup failed");
        return;
    }
    check_values<<<2, 32>>>(d, n);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    std::string text = cap.end();
    show(text);

    CHECK("assert kernel launches", launch == cudaSuccess, "%s (%d)", cudaGetErrorName(launch),
          (int)launch);
    CHECK("cudaDeviceSynchronize returns cudaErrorAssert (710)", sync == cudaErrorAssert,
          "%s (%d)", cudaGetErrorName(sync), (int)sync);
    CHECK("assertion message names the expression",
          text.find("Assertion") != std::string::npos &&
              text.find("v[i] != 13") != std::string::npos,
          "not in the captured output");
    CHECK("assertion message names block [0,0,0] thread [13,0,0]",
          text.find("block: [0,0,0], thread: [13,0,0]") != std::string::npos,
          "not in the captured output");

    cudaError_t last = cudaGetLastError();
    CHECK("cudaGetLastError returns cudaErrorAssert", last == cudaErrorAssert, "%s (%d)",
          cudaGetErrorName(last), (int)last);
    last = cudaGetLastError();
    printf("# second cudaGetLastError: %s (%d)\n", cudaGetErrorName(last), (int)last);

    // Sticky: the context is unusable from now on.
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, 256);
    CHECK("sticky: cudaMalloc afterwards returns cudaErrorAssert", e == cudaErrorAssert,
          "%s (%d)", cudaGetErrorName(e), (int)e);
    e = cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost);
    CHECK("sticky: cudaMemcpy afterwards returns cudaErrorAssert", e == cudaErrorAssert,
          "%s (%d)", cudaGetErrorName(e), (int)e);
    check_values<<<1, 1>>>(d, 1);
    e = cudaGetLastError();
    printf("# launch after the assert: %s (%d)\n", cudaGetErrorName(e), (int)e);
    e = cudaDeviceSynchronize();
    CHECK("sticky: cudaDeviceSynchronize again returns cudaErrorAssert", e == cudaErrorAssert,
          "%s (%d)", cudaGetErrorName(e), (int)e);
}

int main(int argc, char **argv)
{
    bool assert_mode = argc > 1 && strcmp(argv[1], "assert") == 0;
    if (argc > 1 && !assert_mode) {
        fprintf(stderr, "usage: %s [assert]\n", argv[0]);
        return 2;
    }
    g_program = assert_mode ? "device_io assert" : "device_io";
    if (!device_present())
        return finish();
    if (assert_mode)
        run_assert();
    else
        run_printf();
    return finish();
}
