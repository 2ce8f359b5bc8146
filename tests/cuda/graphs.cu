// Stream capture and CUDA graphs through the CUDA runtime: a captured sequence
// replayed, a capture invalidated by an illegal call, a graph built node by node
// with a host node, and an executable graph's kernel parameters changed.
// Self-checking: one `ok`/`FAIL` line per check, exit status 1 if anything failed.
#include "check.h"

#include <vector>

__global__ void axpb(float *y, const float *x, float a, float b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i];
}

static const int N = 1 << 14;
static const int THREADS = 256;

static int host_calls = 0;
static void CUDART_CB host_node(void *arg) { host_calls += *(int *)arg; }

static long mismatch(const std::vector<float> &y, const std::vector<float> &x, float c, float k)
{
    for (int i = 0; i < N; ++i)
        if (y[i] != c + k * x[i]) return i;
    return -1;
}

int main()
{
    g_program = "graphs";
    if (!device_present()) return finish();
    std::vector<float> hx(N), hy(N);
    for (int i = 0; i < N; ++i) hx[i] = (float)(i % 41);
    float *x = nullptr, *y = nullptr;
    REQUIRE(cudaMalloc(&x, N * sizeof(float)));
    REQUIRE(cudaMalloc(&y, N * sizeof(float)));
    REQUIRE(cudaMemcpy(x, hx.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Capture: y = 1; y = 2x + y; y = 3x + y; copy y back.
    cudaGraph_t g = nullptr;
    CHECK_CUDA("begin capture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CHECK_CUDA("is capturing", cudaStreamIsCapturing(s, &st));
    CHECK("status active", st == cudaStreamCaptureStatusActive, "status %d", (int)st);
    std::vector<float> ones(N, 1.0f);
    CUDA_OK(cudaMemcpyAsync(y, ones.data(), N * sizeof(float), cudaMemcpyHostToDevice, s));
    axpb<<<N / THREADS, THREADS, 0, s>>>(y, x, 2.0f, 1.0f, N);
    axpb<<<N / THREADS, THREADS, 0, s>>>(y, x, 3.0f, 1.0f, N);
    CUDA_OK(cudaMemcpyAsync(hy.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA("end capture", cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CHECK_CUDA("graph nodes", cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK("four captured nodes", nodes == 4, "%zu nodes", nodes);
    cudaGraphExec_t e = nullptr;
    CHECK_CUDA("instantiate", cudaGraphInstantiateWithFlags(&e, g, 0));
    bool all = true;
    for (int rep = 0; rep < 5; ++rep) {
        std::fill(hy.begin(), hy.end(), 0.0f);
        all &= CUDA_OK(cudaGraphLaunch(e, s));
        all &= CUDA_OK(cudaStreamSynchronize(s));
        all &= mismatch(hy, hx, 1.0f, 5.0f) < 0;
    }
    CHECK("five replays compute y = 1 + 5x", all, "first mismatch %ld", mismatch(hy, hx, 1.0f, 5.0f));

    // An illegal call during a global capture invalidates it.
    float *tmp = nullptr;
    CHECK_CUDA("begin capture again", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaError_t err = cudaMalloc(&tmp, 256);
    CHECK("cudaMalloc during capture is refused", err == cudaErrorStreamCaptureUnsupported,
          "%s", cudaGetErrorName(err));
    cudaGraph_t bad = nullptr;
    err = cudaStreamEndCapture(s, &bad);
    CHECK("the capture was invalidated", err == cudaErrorStreamCaptureInvalidated, "%s",
          cudaGetErrorName(err));
    cudaGetLastError();

    // A graph built node by node: kernel -> host node.
    cudaGraph_t g2 = nullptr;
    CHECK_CUDA("graph create", cudaGraphCreate(&g2, 0));
    float a = 4.0f, b = 0.0f;
    int n = N;
    void *args[] = {&y, &x, &a, &b, &n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)axpb;
    kp.gridDim = dim3(N / THREADS);
    kp.blockDim = dim3(THREADS);
    kp.kernelParams = args;
    cudaGraphNode_t kn = nullptr, hn = nullptr;
    CHECK_CUDA("kernel node", cudaGraphAddKernelNode(&kn, g2, nullptr, 0, &kp));
    int inc = 1;
    cudaHostNodeParams hp = {host_node, &inc};
    CHECK_CUDA("host node", cudaGraphAddHostNode(&hn, g2, &kn, 1, &hp));
    cudaGraphExec_t e2 = nullptr;
    CHECK_CUDA("instantiate", cudaGraphInstantiateWithFlags(&e2, g2, 0));
    CHECK_CUDA("launch", cudaGraphLaunch(e2, s));
    CHECK_CUDA("launch", cudaGraphLaunch(e2, s));
    CHECK_CUDA("sync", cudaStreamSynchronize(s));
    CHECK("the host node ran per launch", host_calls == 2, "%d calls", host_calls);
    CUDA_OK(cudaMemcpy(hy.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK("y = 4x", mismatch(hy, hx, 0.0f, 4.0f) < 0, "first mismatch %ld", mismatch(hy, hx, 0.0f, 4.0f));

    // Changing the executable graph's kernel parameters.
    a = 6.0f;
    CHECK_CUDA("exec kernel node set params", cudaGraphExecKernelNodeSetParams(e2, kn, &kp));
    CHECK_CUDA("launch", cudaGraphLaunch(e2, s));
    CHECK_CUDA("sync", cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(hy.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK("y = 6x", mismatch(hy, hx, 0.0f, 6.0f) < 0, "first mismatch %ld", mismatch(hy, hx, 0.0f, 6.0f));

    CHECK_CUDA("exec destroy", cudaGraphExecDestroy(e));
    CHECK_CUDA("exec destroy", cudaGraphExecDestroy(e2));
    CHECK_CUDA("graph destroy", cudaGraphDestroy(g));
    CHECK_CUDA("graph destroy", cudaGraphDestroy(g2));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
    CUDA_OK(cudaStreamDestroy(s));
    return finish();
}
