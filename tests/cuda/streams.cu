// Streams, async copies, events and host callbacks through the CUDA runtime.
// Self-checking: one `ok`/`FAIL` line per check, exit status 1 if anything
// failed.
#include "check.h"

#include <atomic>
#include <thread>
#include <vector>

__global__ void scale_add(float *p, float mul, float add, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * mul + add;
}

__global__ void increment(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

// Spins for a while so that work is still queued when the host looks.
__global__ void busy(int *p, int iters)
{
    int acc = 0;
    for (int k = 0; k < iters; ++k) acc = acc * 1664525 + 1013904223;
    if (threadIdx.x == 0) p[blockIdx.x] = acc;
}

// ------------------------------------------------------------ host callbacks

struct CallbackState {
    const int *pinned;     // the D2H destination the callback inspects
    int n;
    std::atomic<int> calls{0};
    std::atomic<int> first_value{-1};
    std::atomic<int> all_equal{0};
    std::atomic<bool> in_cuda_thread{false};
    std::thread::id main_thread;
};

static void CUDART_CB host_func(void *user)
{
    CallbackState *st = (CallbackState *)user;
    // The copy queued before the callback has completed: all values are set.
    int first = st->pinned[0];
    bool same = true;
    for (int i = 1; i < st->n; ++i)
        if (st->pinned[i] != first) { same = false; break; }
    st->first_value = first;
    st->all_equal = same ? 1 : 0;
    st->in_cuda_thread = std::this_thread::get_id() != st->main_thread;
    st->calls++;
}

struct AddCallbackState {
    std::atomic<int> calls{0};
    std::atomic<int> status{-1};
    std::atomic<int> order{0};
};
static std::atomic<int> g_order{0};

static void CUDART_CB stream_callback(cudaStream_t, cudaError_t status, void *user)
{
    AddCallbackState *st = (AddCallbackState *)user;
    st->status = (int)status;
    st->order = ++g_order;
    st->calls++;
}

// ------------------------------------------------------------------- tests

static void test_async_copies_on_streams()
{
    const int n = 16384;
    const size_t bytes = n * sizeof(float);
    cudaStream_t s[2] = {nullptr, nullptr};
    CHECK_CUDA("cudaStreamCreate s0", cudaStreamCreate(&s[0]));
    CHECK_CUDA("cudaStreamCreate s1", cudaStreamCreate(&s[1]));
    CHECK("streams are distinct and not the null stream", s[0] && s[1] && s[0] != s[1],
          "%p %p", (void *)s[0], (void *)s[1]);

    float *h_in[2], *h_out[2], *d[2];
    for (int k = 0; k < 2; ++k) {
        REQUIRE(cudaMallocHost(&h_in[k], bytes));
        REQUIRE(cudaMallocHost(&h_out[k], bytes));
        REQUIRE(cudaMalloc(&d[k], bytes));
        for (int i = 0; i < n; ++i) {
            h_in[k][i] = (float)(i % 1000) + (float)k * 0.5f;
            h_out[k][i] = -1.0f;
        }
    }
    // Interleave the two pipelines: H2D, kernel, D2H on each stream.
    for (int k = 0; k < 2; ++k)
        CUDA_OK(cudaMemcpyAsync(d[k], h_in[k], bytes, cudaMemcpyHostToDevice, s[k]));
    for (int k = 0; k < 2; ++k) {
        scale_add<<<(n + 255) / 256, 256, 0, s[k]>>>(d[k], k ? 3.0f : 2.0f, k ? -1.0f : 1.0f, n);
        CUDA_OK(cudaGetLastError());
    }
    for (int k = 0; k < 2; ++k)
        CUDA_OK(cudaMemcpyAsync(h_out[k], d[k], bytes, cudaMemcpyDeviceToHost, s[k]));
    CHECK_CUDA("cudaStreamSynchronize s0", cudaStreamSynchronize(s[0]));
    CHECK_CUDA("cudaStreamSynchronize s1", cudaStreamSynchronize(s[1]));
    for (int k = 0; k < 2; ++k) {
        long bad = -1;
        float mul = k ? 3.0f : 2.0f, add = k ? -1.0f : 1.0f;
        for (int i = 0; i < n; ++i)
            if (h_out[k][i] != h_in[k][i] * mul + add) { bad = i; break; }
        char what[96];
        snprintf(what, sizeof what, "stream %d: async H2D, kernel, async D2H", k);
        CHECK(what, bad < 0, "index %ld: got %g want %g", bad, bad < 0 ? 0.0 : h_out[k][bad],
              bad < 0 ? 0.0 : h_in[k][bad] * mul + add);
    }

    // Async copy from pageable memory and on the legacy default stream.
    std::vector<float> pageable(n), back(n, 0.0f);
    for (int i = 0; i < n; ++i) pageable[i] = (float)(n - i);
    CUDA_OK(cudaMemcpyAsync(d[0], pageable.data(), bytes, cudaMemcpyHostToDevice, 0));
    scale_add<<<(n + 255) / 256, 256>>>(d[0], 1.0f, 0.25f, n);
    CUDA_OK(cudaMemcpyAsync(back.data(), d[0], bytes, cudaMemcpyDeviceToHost, 0));
    CHECK_CUDA("cudaStreamSynchronize(0)", cudaStreamSynchronize(0));
    long bad = -1;
    for (int i = 0; i < n; ++i)
        if (back[i] != pageable[i] + 0.25f) { bad = i; break; }
    CHECK("default stream: pageable async copies and kernel", bad < 0, "index %ld: got %g",
          bad, bad < 0 ? 0.0 : back[bad]);

    // Stream order: a chain of 20 increments on one stream, then an async
    // D2D and a D2H copy; only in-order execution gives exactly 20.
    int *di, *hi;
    const int m = 1000;
    REQUIRE(cudaMalloc(&di, m * sizeof(int)));
    REQUIRE(cudaMallocHost(&hi, m * sizeof(int)));
    CUDA_OK(cudaMemset(di, 0, m * sizeof(int)));
    for (int r = 0; r < 20; ++r) increment<<<(m + 127) / 128, 128, 0, s[1]>>>(di, m);
    CUDA_OK(cudaMemcpyAsync(d[1], di, m * sizeof(int), cudaMemcpyDeviceToDevice, s[1]));
    CUDA_OK(cudaMemcpyAsync(hi, d[1], m * sizeof(int), cudaMemcpyDeviceToHost, s[1]));
    CUDA_OK(cudaStreamSynchronize(s[1]));
    bad = -1;
    for (int i = 0; i < m; ++i)
        if (hi[i] != 20) { bad = i; break; }
    CHECK("20 kernels + async D2D + D2H in stream order", bad < 0, "index %ld = %d", bad,
          bad < 0 ? 0 : hi[bad]);

    CHECK_CUDA("cudaDeviceSynchronize", cudaDeviceSynchronize());
    for (int k = 0; k < 2; ++k) {
        CUDA_OK(cudaFreeHost(h_in[k]));
        CUDA_OK(cudaFreeHost(h_out[k]));
        CUDA_OK(cudaFree(d[k]));
    }
    CUDA_OK(cudaFree(di));
    CUDA_OK(cudaFreeHost(hi));
    CHECK_CUDA("cudaStreamDestroy s0", cudaStreamDestroy(s[0]));
    CHECK_CUDA("cudaStreamDestroy s1", cudaStreamDestroy(s[1]));
}

static void test_events()
{
    cudaStream_t s;
    REQUIRE(cudaStreamCreate(&s));
    cudaEvent_t start, stop;
    CHECK_CUDA("cudaEventCreate start", cudaEventCreate(&start));
    CHECK_CUDA("cudaEventCreate stop", cudaEventCreate(&stop));
    int *d;
    REQUIRE(cudaMalloc(&d, 64 * sizeof(int)));

    CHECK_CUDA("cudaEventRecord start", cudaEventRecord(start, s));
    busy<<<16, 64, 0, s>>>(d, 50);
    CUDA_OK(cudaGetLastError());
    CHECK_CUDA("cudaEventRecord stop", cudaEventRecord(stop, s));
    CHECK_CUDA("cudaEventSynchronize stop", cudaEventSynchronize(stop));
    float ms = -1.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, start, stop);
    CHECK("cudaEventElapsedTime succeeds", e == cudaSuccess, "%s (%d)", cudaGetErrorName(e),
          (int)e);
    printf("# elapsed %.3f ms\n", ms);
    CHECK("elapsed time is finite and >= 0", ms >= 0.0f && ms < 600000.0f, "%g ms", ms);
    float back = -1.0f;
    e = cudaEventElapsedTime(&back, stop, start);
    CHECK("elapsed time stop -> start is <= 0 (or an error)",
          e != cudaSuccess || back <= 0.0f, "%g ms", back);
    cudaGetLastError();

    // Event on the default stream, then synchronize.
    cudaEvent_t ev0;
    CUDA_OK(cudaEventCreate(&ev0));
    increment<<<1, 64>>>(d, 64);
    CHECK_CUDA("cudaEventRecord on the default stream", cudaEventRecord(ev0, 0));
    CHECK_CUDA("cudaEventSynchronize on the default stream", cudaEventSynchronize(ev0));

    // A never-recorded event: elapsed time is an error.
    cudaEvent_t fresh;
    CUDA_OK(cudaEventCreate(&fresh));
    e = cudaEventElapsedTime(&ms, fresh, stop);
    CHECK("cudaEventElapsedTime with an unrecorded event fails", e != cudaSuccess,
          "returned cudaSuccess");
    printf("# unrecorded event elapsed time returned %s (%d)\n", cudaGetErrorName(e), (int)e);
    cudaGetLastError();

    CHECK_CUDA("cudaEventDestroy", cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
    CUDA_OK(cudaEventDestroy(ev0));
    CUDA_OK(cudaEventDestroy(fresh));
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(s));
}

static void test_host_callbacks()
{
    const int n = 2048;
    cudaStream_t s;
    REQUIRE(cudaStreamCreate(&s));
    int *d, *h;
    REQUIRE(cudaMalloc(&d, n * sizeof(int)));
    REQUIRE(cudaMallocHost(&h, n * sizeof(int)));
    for (int i = 0; i < n; ++i) h[i] = 0;

    CallbackState st;
    st.pinned = h;
    st.n = n;
    st.main_thread = std::this_thread::get_id();

    CUDA_OK(cudaMemset(d, 0, n * sizeof(int)));
    for (int r = 0; r < 5; ++r) increment<<<n / 256, 256, 0, s>>>(d, n);
    CUDA_OK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA("cudaLaunchHostFunc", cudaLaunchHostFunc(s, host_func, &st));

    AddCallbackState ac;
    CHECK_CUDA("cudaStreamAddCallback", cudaStreamAddCallback(s, stream_callback, &ac, 0));
    // Work after the callbacks: the callbacks must not see it (they read h).
    increment<<<n / 256, 256, 0, s>>>(d, n);

    CHECK_CUDA("cudaStreamSynchronize after callbacks", cudaStreamSynchronize(s));
    CHECK("cudaLaunchHostFunc callback ran once", st.calls == 1, "calls = %d", st.calls.load());
    CHECK("host callback ran after the preceding copy",
          st.first_value == 5 && st.all_equal == 1, "first value %d, all equal %d",
          st.first_value.load(), st.all_equal.load());
    printf("# host callback ran on %s\n",
           st.in_cuda_thread.load() ? "another thread" : "the calling thread");
    CHECK("cudaStreamAddCallback callback ran once with cudaSuccess",
          ac.calls == 1 && ac.status == (int)cudaSuccess, "calls %d status %d",
          ac.calls.load(), ac.status.load());

    // Callbacks on two streams, both complete by cudaDeviceSynchronize.
    cudaStream_t s2;
    REQUIRE(cudaStreamCreate(&s2));
    AddCallbackState a1, a2;
    busy<<<4, 32, 0, s>>>(d, 100);
    CUDA_OK(cudaStreamAddCallback(s, stream_callback, &a1, 0));
    CUDA_OK(cudaStreamAddCallback(s2, stream_callback, &a2, 0));
    CHECK_CUDA("cudaDeviceSynchronize waits for callbacks", cudaDeviceSynchronize());
    CHECK("callbacks on two streams both ran", a1.calls == 1 && a2.calls == 1,
          "calls %d and %d", a1.calls.load(), a2.calls.load());

    int back[4];
    CUDA_OK(cudaMemcpy(back, d + 4, sizeof back, cudaMemcpyDeviceToHost));
    CHECK("work queued after the callbacks ran too", back[0] == 6, "d[4] = %d, want 6",
          back[0]);

    CUDA_OK(cudaStreamDestroy(s2));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(h));
}

int main()
{
    g_program = "streams";
    if (!device_present())
        return finish();
    test_async_copies_on_streams();
    test_events();
    test_host_callbacks();
    return finish();
}
