/*
 * NVIDIA's cuBLAS on vgpu (PyPI nvidia-cublas-cu12, linked against NVIDIA's
 * CUDA 12 runtime): it creates and destroys its handle through vgpu's
 * libcuda.so.1. Its kernels ship as cubins, and many of libcublas's also as
 * PTX for compute 12.0, which the simulated GPU runs: saxpy, gemv, a small
 * gemm, scal, geam, strided batched and typed products and the reductions
 * compute the right results on both devices. Matrix products ask the
 * driver's tools tables for the thread's context and the context's number on
 * their way (refused, they failed with CUBLAS_STATUS_NOT_SUPPORTED on any
 * device), and the reductions (dot, nrm2, asum, amax) the stream their result
 * buffers belong to. The context stays usable throughout.
 *
 * Usage: cublas [sim|gpu] (the same checks on both). Each check prints "ok <what>" or "FAIL <what>";
 * the exit status is the number of failures.
 */
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "lib_check.h"

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    enum { N = 64 };

    cublasHandle_t blas;
    cublasStatus_t bs = cublasCreate(&blas);
    expect("cublasCreate", bs == CUBLAS_STATUS_SUCCESS, bs);
    int version = 0;
    bs = cublasGetVersion(blas, &version);
    expect("cublasGetVersion", bs == CUBLAS_STATUS_SUCCESS && version >= 120000, version);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    bs = cublasSetStream(blas, stream);
    expect("cublasSetStream", bs == CUBLAS_STATUS_SUCCESS, bs);

    float *x, *y;
    cudaMalloc((void **)&x, N * sizeof(float));
    cudaMalloc((void **)&y, N * sizeof(float));
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)i;
    bs = cublasSetVector(N, sizeof(float), h, 1, x, 1);
    expect("cublasSetVector", bs == CUBLAS_STATUS_SUCCESS, bs);
    bs = cublasSetVector(N, sizeof(float), h, 1, y, 1);
    float alpha = 2.0f;
    bs = cublasSaxpy(blas, N, &alpha, x, 1, y, 1);
    cudaError_t sync = cudaStreamSynchronize(stream);
    float out[N];
    cublasGetVector(N, sizeof(float), y, 1, out, 1);
    expect("cublasSaxpy", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess && out[N - 1] == 3.0f * (N - 1), bs);
    cudaGetLastError();

    /* The reductions: dot(x, x) = sum of i^2, its square root, sum of |i|, the (1-based)
     * index of the largest. cuBLAS keeps their result buffers per stream, which it identifies
     * through entries 51 and 39 of the driver's CUDA 13 tools table (refused, every reduction
     * failed with CUBLAS_STATUS_INTERNAL_ERROR). */
    const float sum_sq = (float)((N - 1) * N * (2 * N - 1) / 6);
    float dot = 0.0f;
    bs = cublasSdot(blas, N, x, 1, x, 1, &dot);
    expect("cublasSdot on a stream", bs == CUBLAS_STATUS_SUCCESS && dot == sum_sq, bs);
    cublasSetStream(blas, 0);
    dot = 0.0f;
    bs = cublasSdot(blas, N, x, 1, x, 1, &dot);
    expect("cublasSdot on the default stream", bs == CUBLAS_STATUS_SUCCESS && dot == sum_sq, bs);
    cublasSetStream(blas, stream);
    float *dev_dot;
    cudaMalloc((void **)&dev_dot, sizeof(float));
    cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_DEVICE);
    bs = cublasSdot(blas, N, x, 1, x, 1, dev_dot);
    sync = cudaStreamSynchronize(stream);
    cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST);
    dot = 0.0f;
    cudaMemcpy(&dot, dev_dot, sizeof dot, cudaMemcpyDeviceToHost);
    cudaFree(dev_dot);
    expect("cublasSdot into device memory",
           bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess && dot == sum_sq, bs);
    float norm = 0.0f;
    bs = cublasSnrm2(blas, N, x, 1, &norm);
    expect("cublasSnrm2", bs == CUBLAS_STATUS_SUCCESS && norm * norm > sum_sq * 0.9999f &&
                              norm * norm < sum_sq * 1.0001f, bs);
    float asum = 0.0f;
    bs = cublasSasum(blas, N, x, 1, &asum);
    expect("cublasSasum", bs == CUBLAS_STATUS_SUCCESS && asum == (float)((N - 1) * N / 2), bs);
    int largest = 0;
    bs = cublasIsamax(blas, N, x, 1, &largest);
    expect("cublasIsamax", bs == CUBLAS_STATUS_SUCCESS && largest == N, bs);
    cudaGetLastError();

    /* y = A x for the 8 x 64 matrix of ones (column-major, lda 8): every row sums x. */
    enum { ROWS = 8 };
    float *ma, *mv;
    cudaMalloc((void **)&ma, ROWS * N * sizeof(float));
    cudaMalloc((void **)&mv, ROWS * sizeof(float));
    float mones[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) mones[i] = 1.0f;
    cudaMemcpy(ma, mones, sizeof mones, cudaMemcpyHostToDevice);
    float unit = 1.0f, none = 0.0f;
    bs = cublasSgemv(blas, CUBLAS_OP_N, ROWS, N, &unit, ma, ROWS, x, 1, &none, mv, 1);
    sync = cudaStreamSynchronize(stream);
    float rows[ROWS];
    cudaMemcpy(rows, mv, sizeof rows, cudaMemcpyDeviceToHost);
    expect("cublasSgemv", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess &&
                              rows[0] == (float)((N - 1) * N / 2) && rows[ROWS - 1] == rows[0], bs);
    cudaFree(ma);
    cudaFree(mv);
    cudaGetLastError();

    /* A matrix product goes through cuBLASLt's heuristics, which ask the driver's tools TLS
     * table for the thread's tools state (a NULL entry there crashed the process). */
    enum { M = 8 };
    float *a, *c;
    cudaMalloc((void **)&a, M * M * sizeof(float));
    cudaMalloc((void **)&c, M * M * sizeof(float));
    float ones[M * M];
    for (int i = 0; i < M * M; i++) ones[i] = 1.0f;
    cudaMemcpy(a, ones, sizeof ones, cudaMemcpyHostToDevice);
    float one = 1.0f, zero = 0.0f;
    bs = cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, M, M, M, &one, a, M, a, M, &zero, c, M);
    sync = cudaStreamSynchronize(stream);
    float prod[M * M] = {0};
    cudaMemcpy(prod, c, sizeof prod, cudaMemcpyDeviceToHost);
    expect("cublasSgemm", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess &&
                              prod[0] == (float)M && prod[M * M - 1] == (float)M, bs);
    cudaGetLastError();
    cudaFree(a);
    cudaFree(c);
    /* More of the library, each on its own buffers: scaling, a matrix sum, batched products,
     * the typed product cuBLASLt serves, a double-precision dot product. */
    enum { K = 8 };
    float kones[K * K], kid[K * K];
    for (int i = 0; i < K * K; i++) {
        kones[i] = 1.0f;
        kid[i] = (i % (K + 1)) == 0;
    }
    float *ka, *kb, *kc;
    cudaMalloc((void **)&ka, sizeof kones);
    cudaMalloc((void **)&kb, sizeof kid);
    cudaMalloc((void **)&kc, sizeof kones);
    cudaMemcpy(ka, kones, sizeof kones, cudaMemcpyHostToDevice);
    cudaMemcpy(kb, kid, sizeof kid, cudaMemcpyHostToDevice);
    float two = 2.0f, kout[K * K];
    cudaMemcpy(kc, kones, sizeof kones, cudaMemcpyHostToDevice);
    bs = cublasSscal(blas, K * K, &two, kc, 1);
    sync = cudaStreamSynchronize(stream);
    cudaMemcpy(kout, kc, sizeof kout, cudaMemcpyDeviceToHost);
    expect("cublasSscal", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess && kout[K * K - 1] == 2.0f, bs);
    bs = cublasSgeam(blas, CUBLAS_OP_N, CUBLAS_OP_N, K, K, &one, ka, K, &one, kb, K, kc, K);
    sync = cudaStreamSynchronize(stream);
    cudaMemcpy(kout, kc, sizeof kout, cudaMemcpyDeviceToHost);
    expect("cublasSgeam", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess && kout[0] == 2.0f &&
                              kout[1] == 1.0f, bs);
    /* Four 4 x 4 products of ones, 16 floats apart. */
    bs = cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, ka, 4, 16, ka, 4, 16,
                                   &zero, kc, 4, 16, 4);
    sync = cudaStreamSynchronize(stream);
    cudaMemcpy(kout, kc, sizeof kout, cudaMemcpyDeviceToHost);
    expect("cublasSgemmStridedBatched", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess &&
                                            kout[0] == 4.0f && kout[K * K - 1] == 4.0f, bs);
    bs = cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, K, K, K, &one, ka, CUDA_R_32F, K, ka, CUDA_R_32F, K,
                      &zero, kc, CUDA_R_32F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    sync = cudaStreamSynchronize(stream);
    cudaMemcpy(kout, kc, sizeof kout, cudaMemcpyDeviceToHost);
    expect("cublasGemmEx", bs == CUBLAS_STATUS_SUCCESS && sync == cudaSuccess && kout[0] == (float)K &&
                               kout[K * K - 1] == (float)K, bs);
    double dh[N], *dd, ddot = 0.0;
    for (int i = 0; i < N; i++) dh[i] = (double)i;
    cudaMalloc((void **)&dd, sizeof dh);
    cudaMemcpy(dd, dh, sizeof dh, cudaMemcpyHostToDevice);
    bs = cublasDdot(blas, N, dd, 1, dd, 1, &ddot);
    expect("cublasDdot", bs == CUBLAS_STATUS_SUCCESS && ddot == (double)sum_sq, bs);
    cudaFree(dd);
    cudaFree(ka);
    cudaFree(kb);
    cudaFree(kc);
    cudaGetLastError();

    bs = cublasDestroy(blas);
    expect("cublasDestroy", bs == CUBLAS_STATUS_SUCCESS, bs);

    /* The context is still usable. */
    float back[N];
    cudaError_t e = cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost);
    expect("the context still works", e == cudaSuccess && back[5] == 5.0f, e);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(stream);
    printf("# cublas: %d failed\n", failures);
    return failures;
}
