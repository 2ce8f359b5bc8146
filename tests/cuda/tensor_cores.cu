// Tensor core matrix multiplies through NVIDIA's runtime, as the CUDA samples
// cudaTensorCoreGemm, bf16TensorCoreGemm, tf32TensorCoreGemm, immaTensorCoreGemm
// and dmmaTensorCoreGemm write them with the wmma API (built for compute_80):
// C = alpha A B + beta C over tiles of warps, with each element type, against
// products computed on the host; and with the mma.sync and ldmatrix instructions
// whose fragment layouts the PTX ISA specifies.
#include "check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <vector>

using namespace nvcuda;

constexpr int M = 64, N = 64, K = 96;  // multiples of every tile below

// C (row-major, M x N) = alpha A (row-major, M x K) B (col-major, K x N) + beta C, one warp per
// TM x TN tile, TK deep; T is the element type of A and B, Acc of C.
template <int TM, int TN, int TK, typename T, typename Acc>
__global__ void gemm(const T *a, const T *b, Acc *c, Acc alpha, Acc beta)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tj = warp % (N / TN), ti = warp / (N / TN);
    if (ti >= M / TM) return;
    wmma::fragment<wmma::matrix_a, TM, TN, TK, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, TM, TN, TK, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, TM, TN, TK, Acc> acc, fc;
    wmma::fill_fragment(acc, Acc(0));
    for (int k = 0; k < K; k += TK) {
        wmma::load_matrix_sync(fa, a + ti * TM * K + k, K);
        wmma::load_matrix_sync(fb, b + tj * TN * K + k, K);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    Acc *tile = c + ti * TM * N + tj * TN;
    wmma::load_matrix_sync(fc, tile, N, wmma::mem_row_major);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] = alpha * acc.x[i] + beta * fc.x[i];
    wmma::store_matrix_sync(tile, fc, N, wmma::mem_row_major);
}

// TF32: A and B are f32 in memory, rounded to TF32 in the fragments.
__global__ void gemm_tf32(const float *a, const float *b, float *c)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tj = warp % (N / 16), ti = warp / (N / 16);
    if (ti >= M / 16) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 8) {
        wmma::load_matrix_sync(fa, a + ti * 16 * K + k, K);
        wmma::load_matrix_sync(fb, b + tj * 16 * K + k, K);
        for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
        for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + ti * 16 * N + tj * 16, acc, N, wmma::mem_row_major);
}

// The same C = alpha A B + beta C with the instructions CUTLASS- and Triton-style kernels emit:
// each warp stages its A (16x16) and B (8 columns of 16) tiles in shared memory, loads them into
// the fragments mma.sync.m16n8k16 expects with ldmatrix (.x4 for A; .x2 for B, whose columns are
// rows in memory), and applies alpha and beta to D where the PTX ISA places it: lane 4g + t holds
// rows g and g + 8, columns 2t and 2t + 1.
__global__ void gemm_mma_sync(const half *a, const half *b, float *c, float alpha, float beta)
{
    constexpr int WARPS = 4;
    __shared__ __align__(16) half sa[WARPS][16][16];
    __shared__ __align__(16) half sb[WARPS][8][16];
    int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    int tile = blockIdx.x * WARPS + w;
    int tj = tile % (N / 8), ti = tile / (N / 8);
    if (ti >= M / 16) return;
    float acc[4] = {0, 0, 0, 0};
    for (int k = 0; k < K; k += 16) {
        for (int e = l; e < 16 * 16; e += 32) sa[w][e / 16][e % 16] = a[(ti * 16 + e / 16) * K + k + e % 16];
        for (int e = l; e < 8 * 16; e += 32) sb[w][e / 16][e % 16] = b[(tj * 8 + e / 16) * K + k + e % 16];
        __syncwarp();
        unsigned ra[4], rb[2];
        unsigned pa = (unsigned)__cvta_generic_to_shared(&sa[w][l % 16][8 * (l / 16)]);
        unsigned pb = (unsigned)__cvta_generic_to_shared(&sb[w][l % 8][8 * ((l / 8) % 2)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(ra[0]), "=r"(ra[1]), "=r"(ra[2]), "=r"(ra[3])
                     : "r"(pa));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(rb[0]), "=r"(rb[1]) : "r"(pb));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
        __syncwarp();
    }
    for (int i = 0; i < 4; i++) {
        float *e = c + (ti * 16 + g + 8 * (i / 2)) * N + tj * 8 + 2 * t + i % 2;
        *e = alpha * acc[i] + beta * *e;
    }
}

// int8 with mma.sync.m16n8k32 and fragments read straight from global memory as the PTX ISA
// lays them out (A: rows g and g + 8, four bytes from column 4t, and again 16 columns on; B: four
// bytes of column g from row 4t, and again 16 rows on).
__global__ void gemm_mma_sync_s8(const signed char *a, const signed char *b, int *c, int alpha, int beta)
{
    int tile = (blockIdx.x * blockDim.x + threadIdx.x) / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    int tj = tile % (N / 8), ti = tile / (N / 8);
    if (ti >= M / 16) return;
    int acc[4] = {0, 0, 0, 0};
    for (int k = 0; k < K; k += 32) {
        unsigned ra[4], rb[2];
        for (int r = 0; r < 4; r++)
            memcpy(&ra[r], a + (ti * 16 + g + 8 * (r % 2)) * K + k + 4 * t + 16 * (r / 2), 4);
        for (int r = 0; r < 2; r++) memcpy(&rb[r], b + (tj * 8 + g) * K + k + 4 * t + 16 * r, 4);
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+r"(acc[0]), "+r"(acc[1]), "+r"(acc[2]), "+r"(acc[3])
                     : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
    }
    for (int i = 0; i < 4; i++) {
        int *e = c + (ti * 16 + g + 8 * (i / 2)) * N + tj * 8 + 2 * t + i % 2;
        *e = alpha * acc[i] + beta * *e;
    }
}

static float small(int i, int seed) { return float((i * 7 + seed * 13) % 9) - 4.0f; }

// The host's C = alpha A B + beta C, A row-major and B col-major, as doubles.
static std::vector<double> reference(const std::vector<double> &a, const std::vector<double> &b,
                                     const std::vector<double> &c, double alpha, double beta)
{
    std::vector<double> out(M * N);
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double s = 0;
            for (int k = 0; k < K; ++k) s += a[i * K + k] * b[j * K + k];
            out[i * N + j] = alpha * s + beta * c[i * N + j];
        }
    return out;
}

// The launch of a wmma GEMM of TM x TN tiles.
template <int TM, int TN, int TK, typename T, typename Acc>
static void launch_wmma(const T *a, const T *b, Acc *c, Acc alpha, Acc beta)
{
    int warps = (M / TM) * (N / TN);
    gemm<TM, TN, TK, T, Acc><<<(warps + 3) / 4, 128>>>(a, b, c, alpha, beta);
}

// Runs `launch` on inputs `to_t(small)` and checks every element of C against the host.
template <typename T, typename Acc, typename Conv, typename Launch>
static void check_product(const char *what, Conv to_t, Acc alpha, Acc beta, Launch launch)
{
    std::vector<double> a(M * K), b(K * N), c(M * N);
    std::vector<T> ha(M * K), hb(K * N);
    std::vector<Acc> hc(M * N);
    // The host multiplies what the device gets.
    for (int i = 0; i < M * K; ++i) ha[i] = to_t(small(i, 1)), a[i] = double(float(ha[i]));
    for (int i = 0; i < K * N; ++i) hb[i] = to_t(small(i, 2)), b[i] = double(float(hb[i]));
    for (int i = 0; i < M * N; ++i) c[i] = small(i, 3), hc[i] = Acc(c[i]);
    T *da = nullptr, *db = nullptr;
    Acc *dc = nullptr;
    CUDA_OK(cudaMalloc(&da, ha.size() * sizeof(T)));
    CUDA_OK(cudaMalloc(&db, hb.size() * sizeof(T)));
    CUDA_OK(cudaMalloc(&dc, hc.size() * sizeof(Acc)));
    CUDA_OK(cudaMemcpy(da, ha.data(), ha.size() * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dc, hc.data(), hc.size() * sizeof(Acc), cudaMemcpyHostToDevice));
    launch(da, db, dc, alpha, beta);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(hc.data(), dc, hc.size() * sizeof(Acc), cudaMemcpyDeviceToHost));
    std::vector<double> want = reference(a, b, c, double(alpha), double(beta));
    int bad = -1;
    for (int i = 0; i < M * N && bad < 0; ++i)
        if (double(hc[i]) != want[i]) bad = i;
    CHECK(what, bad < 0, "C[%d] = %g, want %g", bad, bad < 0 ? 0.0 : double(hc[bad]), bad < 0 ? 0.0 : want[bad]);
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dc));
}

template <int TM, int TN, int TK, typename T, typename Acc, typename Conv>
static void check_gemm(const char *what, Conv to_t, Acc alpha, Acc beta)
{
    check_product<T, Acc>(what, to_t, alpha, beta, launch_wmma<TM, TN, TK, T, Acc>);
}

int main()
{
    g_program = "tensor_cores";
    int major = 0;
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK("the device has tensor cores (compute capability 7.0 or later)", major >= 7, "%d", major);
    // Small integers: every product and sum is exact in each type, so results compare equal.
    auto to_half = [](double v) { return __float2half(float(v)); };
    auto to_bf16 = [](double v) { return __float2bfloat16(float(v)); };
    check_gemm<16, 16, 16, half, float>("f16 16x16x16, f32 accumulators", to_half, 2.0f, -1.0f);
    check_gemm<32, 8, 16, half, float>("f16 32x8x16, f32 accumulators", to_half, 1.0f, 1.0f);
    check_gemm<8, 32, 16, half, half>("f16 8x32x16, f16 accumulators", to_half, __float2half(1.0f),
                                      __float2half(0.0f));
    check_gemm<16, 16, 16, __nv_bfloat16, float>("bf16 16x16x16", to_bf16, 1.0f, 2.0f);
    check_gemm<16, 16, 16, signed char, int>("int8 16x16x16, int32 accumulators",
                                             [](double v) { return (signed char)v; }, 3, -2);
    check_gemm<32, 8, 16, unsigned char, int>("uint8 32x8x16", [](double v) { return (unsigned char)(v + 4); },
                                              1, 0);
    check_gemm<8, 8, 4, double, double>("f64 8x8x4", [](double v) { return v * 0.5; }, 1.0, 1.0);

    // 16x8 tiles of four warps per block.
    constexpr int MMA_BLOCKS = (M / 16) * (N / 8) / 4;
    check_product<half, float>("mma.sync f16 m16n8k16 fed by ldmatrix", to_half, 2.0f, -1.0f,
                               [](const half *a, const half *b, float *c, float alpha, float beta) {
                                   gemm_mma_sync<<<MMA_BLOCKS, 128>>>(a, b, c, alpha, beta);
                               });
    check_product<signed char, int>("mma.sync int8 m16n8k32", [](double v) { return (signed char)(v * 9); }, 1,
                                    3, [](const signed char *a, const signed char *b, int *c, int alpha, int beta) {
                                        gemm_mma_sync_s8<<<MMA_BLOCKS, 128>>>(a, b, c, alpha, beta);
                                    });

    // TF32 against a host product of the TF32-rounded inputs.
    {
        std::vector<float> a(M * K), b(K * N), c(M * N);
        for (int i = 0; i < M * K; ++i) a[i] = small(i, 4) + 1.0f / 3.0f;
        for (int i = 0; i < K * N; ++i) b[i] = small(i, 5) - 1.0f / 7.0f;
        float *da = nullptr, *db = nullptr, *dc = nullptr;
        CUDA_OK(cudaMalloc(&da, a.size() * 4));
        CUDA_OK(cudaMalloc(&db, b.size() * 4));
        CUDA_OK(cudaMalloc(&dc, c.size() * 4));
        CUDA_OK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
        gemm_tf32<<<((M / 16) * (N / 16) + 3) / 4, 128>>>(da, db, dc);
        CUDA_OK(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
        auto tf32 = [](float v) {
            uint32_t u;
            memcpy(&u, &v, 4);
            u = (u + 0x1000u) & ~0x1fffu;  // round to nearest, ties away, 10 mantissa bits
            memcpy(&v, &u, 4);
            return double(v);
        };
        double worst = 0;
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
                double s = 0, mag = 0;
                for (int k = 0; k < K; ++k) {
                    double p = tf32(a[i * K + k]) * tf32(b[j * K + k]);
                    s += p;
                    mag += fabs(p);
                }
                worst = fmax(worst, fabs(c[i * N + j] - s) / (mag + 1e-30));
            }
        // The products are exact in f32; only the f32 sums may round.
        CHECK("tf32 16x16x8 rounds its inputs to TF32", worst < 1e-6, "relative error %g", worst);
        CUDA_OK(cudaFree(da));
        CUDA_OK(cudaFree(db));
        CUDA_OK(cudaFree(dc));
    }
    return finish();
}
