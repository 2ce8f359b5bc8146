// Tiny self-checking helpers shared by the CUDA runtime test programs.
//
// Every check prints one line: `ok <what>` or `FAIL <what>: <details>`.
// `finish()` prints a `# <program>: N checks, N failed` summary and returns
// the exit status (0 only when nothing failed).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static int g_checks = 0;
static int g_failed = 0;

static inline void report_ok(const char *what)
{
    ++g_checks;
    printf("ok %s\n", what);
    fflush(stdout);
}

static inline void report_fail(const char *what, const char *fmt, ...)
{
    ++g_checks;
    ++g_failed;
    printf("FAIL %s: ", what);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

// `ok <what>` when cond holds, else `FAIL <what>: <details>`.
#define CHECK(what, cond, ...)                  \
    do {                                        \
        if (cond)                               \
            report_ok(what);                    \
        else                                    \
            report_fail(what, __VA_ARGS__);     \
    } while (0)

// A runtime call that must succeed: silent on success, a FAIL line naming the
// call and the error otherwise. Evaluates to true on success.
static inline bool cuda_ok_at(cudaError_t e, const char *call, int line)
{
    if (e == cudaSuccess) return true;
    char what[256];
    snprintf(what, sizeof what, "line %d: %s", line, call);
    report_fail(what, "%s (%d): %s", cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
    return false;
}
#define CUDA_OK(call) cuda_ok_at((call), #call, __LINE__)

// A runtime call that must succeed, reported as its own check.
#define CHECK_CUDA(what, call)                                                          \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        CHECK(what, e_ == cudaSuccess, "%s (%d): %s", cudaGetErrorName(e_), (int)e_,  \
              cudaGetErrorString(e_));                                                  \
    } while (0)

// Setup that the rest of the program depends on: on failure, report and stop.
#define REQUIRE(call)                                                  \
    do {                                                               \
        if (!CUDA_OK(call)) {                                          \
            printf("# stopping: a required call failed\n");            \
            exit(finish_summary());                                    \
        }                                                              \
    } while (0)

static const char *g_program = "cuda-test";

static inline int finish_summary()
{
    printf("# %s: %d checks, %d failed\n", g_program, g_checks, g_failed);
    fflush(stdout);
    return g_failed == 0 ? 0 : 1;
}

static inline int finish() { return finish_summary(); }

// Index of the first element where got != want (exact), or -1.
template <typename T>
static inline long first_mismatch(const T *got, const T *want, long n)
{
    for (long i = 0; i < n; ++i)
        if (!(got[i] == want[i])) return i;
    return -1;
}

// Index of the first element where |got - want| > tol * max(1, |want|), or -1.
static inline long first_mismatch_tol(const float *got, const float *want, long n, float tol)
{
    for (long i = 0; i < n; ++i) {
        float scale = fabsf(want[i]) > 1.0f ? fabsf(want[i]) : 1.0f;
        if (!(fabsf(got[i] - want[i]) <= tol * scale)) return i;
    }
    return -1;
}

/* Whether a CUDA device is present; reports the failure when not. */
static inline bool device_present(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        report_fail("a CUDA device is present", "%s (%d): %s, count %d", cudaGetErrorName(e),
                    (int)e, cudaGetErrorString(e), count);
        return false;
    }
    return true;
}
