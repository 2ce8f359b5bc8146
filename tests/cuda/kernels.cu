// CUDA kernels through the runtime's <<<>>> launches: vector add, saxpy, a
// template kernel for float and int, __shared__ block reductions (static and
// dynamic shared memory), atomicAdd histograms (global and shared), 2-D and
// 3-D grids, by-value struct parameters, __constant__ initializers, device
// globals, virtual functions and function pointers, and launch-configuration
// errors. Self-checking: one `ok`/`FAIL`
// line per check, exit status 1 if anything failed.
#include "check.h"

#include <vector>

// ---------------------------------------------------------------- kernels

__global__ void vector_add(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

__global__ void saxpy(int n, float a, const float *x, float *y)
{
    // Grid-stride loop: launched with fewer threads than elements.
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}

template <typename T>
__global__ void axpb(T *out, const T *in, T a, T b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i] + b;
}
template __global__ void axpb<float>(float *, const float *, float, float, int);
template __global__ void axpb<int>(int *, const int *, int, int, int);

#define REDUCE_THREADS 256

// One partial sum per block, static shared memory, tree reduction.
__global__ void block_sum_static(const int *in, int *partial, int n)
{
    __shared__ int buf[REDUCE_THREADS];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    buf[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = buf[0];
}

// Same with dynamic shared memory (size from the launch) and floats; the
// block results are combined with a float atomicAdd.
__global__ void block_sum_dynamic(const float *in, float *total, int n)
{
    extern __shared__ float fbuf[];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    fbuf[t] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) fbuf[t] += fbuf[t + s];
        __syncthreads();
    }
    if (t == 0) atomicAdd(total, fbuf[0]);
}

#define BINS 64

__global__ void histogram_global(const unsigned *in, unsigned *bins, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[in[i] % BINS], 1u);
}

// Per-block histogram in shared memory, merged into global bins.
__global__ void histogram_shared(const unsigned *in, unsigned *bins, int n)
{
    __shared__ unsigned local[BINS];
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local[in[i] % BINS], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < BINS; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}

// atomicMax / atomicMin / atomicCAS-based counter.
__global__ void atomic_misc(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicMax(&out[0], in[i]);
    atomicMin(&out[1], in[i]);
    // Increment out[2] with a CAS loop.
    int old = out[2], assumed;
    do {
        assumed = old;
        old = atomicCAS(&out[2], assumed, assumed + 1);
    } while (old != assumed);
    // Returned old values of atomicAdd are unique: mark slot 3 + old.
    int ticket = atomicAdd(&out[3], 1);
    out[4 + ticket] = 1;
}

// 2-D: each element gets y * 10000 + x.
__global__ void grid2d(int *out, int width, int height)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) out[y * width + x] = y * 10000 + x;
}

// warpSize in device code (nvcc writes PTX's `WARP_SZ` constant): lane and warp of a thread.
__global__ void warp_lanes(int *out, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) out[t] = warpSize * 100000 + (threadIdx.x / warpSize) * 100 + threadIdx.x % warpSize;
}

// SIMD video intrinsics: nvcc writes PTX's vabsdiff4 for __vsadu4 and __vabsdiffu4, and image
// code writes video instructions in inline assembly (CUDA's stereoDisparity sample's __usad4).
__global__ void simd_video(const unsigned *a, const unsigned *b, unsigned *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = a[i], y = b[i], sad;
    asm("vabsdiff4.u32.u32.u32.add %0, %1, %2, %3;" : "=r"(sad) : "r"(x), "r"(y), "r"(7u));
    out[4 * i] = __vsadu4(x, y);
    out[4 * i + 1] = __vabsdiffu4(x, y);
    out[4 * i + 2] = sad;
    out[4 * i + 3] = __vmaxu2(x, y) ^ __vaddss4(x, y);
}

// 3-D: each element records its coordinates, and the block/thread indices
// that produced it are consistent with blockDim.
__global__ void grid3d(int4 *out, int nx, int ny, int nz)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < nx && y < ny && z < nz) {
        int flat_block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        out[(z * ny + y) * nx + x] = make_int4(x, y, z, flat_block);
    }
}

struct Params {
    char c;       // offset 0
    double d;     // offset 8
    short s;      // offset 16
    int3 v;       // offset 20
    float *dst;   // offset 32
};

// By-value struct and mixed scalar parameters (alignment of the argument
// buffer).
__global__ void params_kernel(Params p, char c2, double d2, unsigned long long u, short s2)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        p.dst[0] = (float)p.c;
        p.dst[1] = (float)p.d;
        p.dst[2] = (float)p.s;
        p.dst[3] = (float)(p.v.x + p.v.y + p.v.z);
        p.dst[4] = (float)c2;
        p.dst[5] = (float)d2;
        p.dst[6] = (float)(u >> 40);
        p.dst[7] = (float)(u & 0xffff);
        p.dst[8] = (float)s2;
    }
}

__constant__ int c_table[8] = {5, -3, 8, 13, -21, 34, 55, -89};
__device__ int g_hits;

__global__ void constant_lookup(const int *idx, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = c_table[idx[i] & 7];
        atomicAdd(&g_hits, 1);
    }
}

__global__ void read_hits(int *out) { *out = g_hits; }

// __managed__ variables: one address for host code and kernels (the runtime asks the
// driver for it with cuModuleGetGlobal / cuLibraryGetManaged when it registers the module).
__managed__ int m_counter = 5;
__managed__ float m_values[4] = {1.0f, 2.0f, 3.0f, 4.0f};

__global__ void bump_managed(int n)
{
    atomicAdd(&m_counter, n);
    // One block doubles the values: two blocks doing it would race (blocks may run at once).
    if (blockIdx.x == 0 && threadIdx.x < 4) m_values[threadIdx.x] *= 2.0f;
}

__device__ __noinline__ float poly(float x) { return (x * x - 2.0f) * x + 1.0f; }

__global__ void call_device_function(const float *in, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = poly(in[i]);
}

// Virtual functions and function pointers: each thread makes an object of one of three
// classes and calls its virtual functions (a warp's lanes call different functions at one call),
// then calls through a table of device function pointers.
struct Animal {
    __device__ virtual int legs() const = 0;
    __device__ virtual int sound(int x) const { return x; }
    __device__ virtual ~Animal() {}
};
struct Dog : Animal {
    __device__ int legs() const override { return 4; }
    __device__ int sound(int x) const override { return 2 * x; }
};
struct Bird : Animal {
    __device__ int legs() const override { return 2; }
};
struct Fish : Animal {
    int fins;
    __device__ explicit Fish(int f) : fins(f) {}
    __device__ int legs() const override { return 0; }
    __device__ int sound(int x) const override { return fins - x; }
};

typedef int (*binop_t)(int, int);
__device__ int op_add(int a, int b) { return a + b; }
__device__ int op_max(int a, int b) { return a > b ? a : b; }
__device__ int op_xor(int a, int b) { return a ^ b; }
__device__ binop_t g_ops[3] = {op_add, op_max, op_xor};

__global__ void virtual_calls(int *legs, int *sounds, int *ops, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Dog dog;
    Bird bird;
    Fish fish(i);
    const Animal *a = i % 3 == 0 ? (const Animal *)&dog : i % 3 == 1 ? (const Animal *)&bird : (const Animal *)&fish;
    legs[i] = a->legs();
    sounds[i] = a->sound(7);
    ops[i] = g_ops[i % 3](i, 100);
}

// ---------------------------------------------------------------- tests

static bool launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        report_fail(what, "launch/sync: %s (%d): %s", cudaGetErrorName(e), (int)e,
                    cudaGetErrorString(e));
        return false;
    }
    return true;
}

static void test_vector_add()
{
    const int n = 10000;
    std::vector<float> a(n), b(n), c(n), want(n);
    for (int i = 0; i < n; ++i) {
        a[i] = (float)i * 0.25f;
        b[i] = 1000.0f - (float)i;
        want[i] = a[i] + b[i];
    }
    float *da, *db, *dc;
    REQUIRE(cudaMalloc(&da, n * sizeof(float)));
    REQUIRE(cudaMalloc(&db, n * sizeof(float)));
    REQUIRE(cudaMalloc(&dc, n * sizeof(float)));
    CUDA_OK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dc, 0xff, n * sizeof(float)));
    vector_add<<<(n + 127) / 128, 128>>>(da, db, dc, n);
    if (launched("vector_add")) {
        CUDA_OK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
        long bad = first_mismatch(c.data(), want.data(), n);
        CHECK("vector_add (10000 elements, 79 blocks x 128)", bad < 0, "index %ld: got %g want %g",
              bad, bad < 0 ? 0.0 : c[bad], bad < 0 ? 0.0 : want[bad]);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

static void test_saxpy()
{
    const int n = 20000;
    const float a = 2.5f;
    std::vector<float> x(n), y(n), want(n), got(n);
    for (int i = 0; i < n; ++i) {
        x[i] = (float)(i % 100) * 0.1f;
        y[i] = (float)(i % 7) - 3.0f;
        want[i] = a * x[i] + y[i];
    }
    float *dx, *dy;
    REQUIRE(cudaMalloc(&dx, n * sizeof(float)));
    REQUIRE(cudaMalloc(&dy, n * sizeof(float)));
    CUDA_OK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    saxpy<<<8, 256>>>(n, a, dx, dy);  // 2048 threads, grid-stride over 20000
    if (launched("saxpy")) {
        CUDA_OK(cudaMemcpy(got.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
        long bad = first_mismatch_tol(got.data(), want.data(), n, 1e-6f);
        CHECK("saxpy (grid-stride, 20000 elements)", bad < 0, "index %ld: got %.9g want %.9g",
              bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    }
    cudaFree(dx);
    cudaFree(dy);
}

template <typename T>
static void test_axpb(const char *what, T a, T b)
{
    const int n = 3000;
    std::vector<T> in(n), got(n), want(n);
    for (int i = 0; i < n; ++i) {
        in[i] = (T)(i - 1500);
        want[i] = a * in[i] + b;
    }
    T *din, *dout;
    REQUIRE(cudaMalloc(&din, n * sizeof(T)));
    REQUIRE(cudaMalloc(&dout, n * sizeof(T)));
    CUDA_OK(cudaMemcpy(din, in.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    axpb<T><<<(n + 255) / 256, 256>>>(dout, din, a, b, n);
    if (launched(what)) {
        CUDA_OK(cudaMemcpy(got.data(), dout, n * sizeof(T), cudaMemcpyDeviceToHost));
        long bad = first_mismatch(got.data(), want.data(), n);
        CHECK(what, bad < 0, "index %ld: got %g want %g", bad,
              bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : (double)want[bad]);
    }
    cudaFree(din);
    cudaFree(dout);
}

static void test_reductions()
{
    const int n = 10000;
    const int blocks = (n + REDUCE_THREADS - 1) / REDUCE_THREADS;
    std::vector<int> in(n);
    long long want = 0;
    for (int i = 0; i < n; ++i) {
        in[i] = (i * 37) % 1001 - 500;
        want += in[i];
    }
    int *din, *dpart;
    REQUIRE(cudaMalloc(&din, n * sizeof(int)));
    REQUIRE(cudaMalloc(&dpart, blocks * sizeof(int)));
    CUDA_OK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    block_sum_static<<<blocks, REDUCE_THREADS>>>(din, dpart, n);
    if (launched("block_sum_static")) {
        std::vector<int> part(blocks);
        CUDA_OK(cudaMemcpy(part.data(), dpart, blocks * sizeof(int), cudaMemcpyDeviceToHost));
        long long got = 0;
        int bad_block = -1;
        for (int bl = 0; bl < blocks; ++bl) {
            long long w = 0;
            for (int i = bl * REDUCE_THREADS; i < n && i < (bl + 1) * REDUCE_THREADS; ++i)
                w += in[i];
            if (part[bl] != w && bad_block < 0) bad_block = bl;
            got += part[bl];
        }
        CHECK("__shared__ block reduction: per-block sums", bad_block < 0, "block %d",
              bad_block);
        CHECK("__shared__ block reduction: total", got == want, "got %lld want %lld", got, want);
    }

    // Float reduction with dynamic shared memory; small integers so the sum
    // is exact whatever the order.
    std::vector<float> fin(n);
    double fwant = 0;
    for (int i = 0; i < n; ++i) {
        fin[i] = (float)(i % 17) - 8.0f;
        fwant += fin[i];
    }
    float *dfin, *dtotal;
    REQUIRE(cudaMalloc(&dfin, n * sizeof(float)));
    REQUIRE(cudaMalloc(&dtotal, sizeof(float)));
    CUDA_OK(cudaMemcpy(dfin, fin.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dtotal, 0, sizeof(float)));
    block_sum_dynamic<<<(n + 127) / 128, 128, 128 * sizeof(float)>>>(dfin, dtotal, n);
    if (launched("block_sum_dynamic")) {
        float got = 0;
        CUDA_OK(cudaMemcpy(&got, dtotal, sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("dynamic shared memory reduction + float atomicAdd", (double)got == fwant,
              "got %.9g want %.9g", (double)got, fwant);
    }
    cudaFree(din);
    cudaFree(dpart);
    cudaFree(dfin);
    cudaFree(dtotal);
}

static void test_histograms()
{
    const int n = 20000;
    std::vector<unsigned> in(n);
    std::vector<unsigned> want(BINS, 0);
    unsigned s = 12345;
    for (int i = 0; i < n; ++i) {
        s = s * 1103515245u + 12345u;
        in[i] = (s >> 8) % 1000 < 300 ? 7u : (s >> 8);  // a hot bin
        want[in[i] % BINS]++;
    }
    unsigned *din, *dbins;
    REQUIRE(cudaMalloc(&din, n * sizeof(unsigned)));
    REQUIRE(cudaMalloc(&dbins, BINS * sizeof(unsigned)));
    CUDA_OK(cudaMemcpy(din, in.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));

    std::vector<unsigned> got(BINS);
    CUDA_OK(cudaMemset(dbins, 0, BINS * sizeof(unsigned)));
    histogram_global<<<(n + 255) / 256, 256>>>(din, dbins, n);
    if (launched("histogram_global")) {
        CUDA_OK(cudaMemcpy(got.data(), dbins, BINS * sizeof(unsigned), cudaMemcpyDeviceToHost));
        long bad = first_mismatch(got.data(), want.data(), BINS);
        CHECK("atomicAdd histogram in global memory", bad < 0, "bin %ld: got %u want %u", bad,
              bad < 0 ? 0u : got[bad], bad < 0 ? 0u : want[bad]);
    }

    CUDA_OK(cudaMemset(dbins, 0, BINS * sizeof(unsigned)));
    histogram_shared<<<10, 128>>>(din, dbins, n);
    if (launched("histogram_shared")) {
        CUDA_OK(cudaMemcpy(got.data(), dbins, BINS * sizeof(unsigned), cudaMemcpyDeviceToHost));
        long bad = first_mismatch(got.data(), want.data(), BINS);
        CHECK("atomicAdd histogram in __shared__ memory", bad < 0, "bin %ld: got %u want %u",
              bad, bad < 0 ? 0u : got[bad], bad < 0 ? 0u : want[bad]);
    }
    cudaFree(din);
    cudaFree(dbins);

    // atomicMax/Min/CAS and unique atomicAdd tickets.
    const int m = 1000;
    std::vector<int> vals(m);
    for (int i = 0; i < m; ++i) vals[i] = (i * 7919) % 2003 - 1000;
    int vmax = -1 << 30, vmin = 1 << 30;
    for (int v : vals) { vmax = v > vmax ? v : vmax; vmin = v < vmin ? v : vmin; }
    std::vector<int> init(4 + m, 0);
    init[0] = -1 << 30;
    init[1] = 1 << 30;
    int *dvals, *dout;
    REQUIRE(cudaMalloc(&dvals, m * sizeof(int)));
    REQUIRE(cudaMalloc(&dout, (4 + m) * sizeof(int)));
    CUDA_OK(cudaMemcpy(dvals, vals.data(), m * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dout, init.data(), (4 + m) * sizeof(int), cudaMemcpyHostToDevice));
    atomic_misc<<<(m + 127) / 128, 128>>>(dvals, dout, m);
    if (launched("atomic_misc")) {
        std::vector<int> out(4 + m);
        CUDA_OK(cudaMemcpy(out.data(), dout, (4 + m) * sizeof(int), cudaMemcpyDeviceToHost));
        CHECK("atomicMax", out[0] == vmax, "got %d want %d", out[0], vmax);
        CHECK("atomicMin", out[1] == vmin, "got %d want %d", out[1], vmin);
        CHECK("atomicCAS counter", out[2] == m, "got %d want %d", out[2], m);
        int marked = 0;
        for (int i = 0; i < m; ++i) marked += out[4 + i];
        CHECK("atomicAdd returns unique old values", out[3] == m && marked == m,
              "count %d, marked %d, want %d", out[3], marked, m);
    }
    cudaFree(dvals);
    cudaFree(dout);
}

static unsigned lanes_of(unsigned x, int bits, int lane, bool is_signed)
{
    unsigned v = (x >> (bits * lane)) & ((1u << bits) - 1);
    if (is_signed && (v >> (bits - 1)) & 1) v |= ~((1u << bits) - 1);
    return v;
}

static void test_simd_video()
{
    const int n = 500;
    std::vector<unsigned> ha(n), hb(n), want(4 * n);
    unsigned seed = 12345;
    for (int i = 0; i < n; ++i) {
        ha[i] = seed = seed * 1664525u + 1013904223u;
        hb[i] = seed = seed * 1664525u + 1013904223u;
        unsigned sad = 0, diff = 0, maxes = 0, sums = 0;
        for (int k = 0; k < 4; ++k) {
            int x = lanes_of(ha[i], 8, k, false), y = lanes_of(hb[i], 8, k, false);
            sad += x > y ? x - y : y - x;
            diff |= (unsigned)(x > y ? x - y : y - x) << (8 * k);
            int sx = (int)lanes_of(ha[i], 8, k, true), sy = (int)lanes_of(hb[i], 8, k, true);
            int sum = sx + sy < -128 ? -128 : sx + sy > 127 ? 127 : sx + sy;
            sums |= ((unsigned)sum & 0xffu) << (8 * k);
        }
        for (int k = 0; k < 2; ++k) {
            unsigned x = lanes_of(ha[i], 16, k, false), y = lanes_of(hb[i], 16, k, false);
            maxes |= (x > y ? x : y) << (16 * k);
        }
        want[4 * i] = sad;
        want[4 * i + 1] = diff;
        want[4 * i + 2] = sad + 7;
        want[4 * i + 3] = maxes ^ sums;
    }
    unsigned *da, *db, *dout;
    REQUIRE(cudaMalloc(&da, n * sizeof(unsigned)));
    REQUIRE(cudaMalloc(&db, n * sizeof(unsigned)));
    REQUIRE(cudaMalloc(&dout, 4 * n * sizeof(unsigned)));
    CUDA_OK(cudaMemcpy(da, ha.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    simd_video<<<(n + 127) / 128, 128>>>(da, db, dout, n);
    if (launched("simd_video")) {
        std::vector<unsigned> got(4 * n);
        CUDA_OK(cudaMemcpy(got.data(), dout, 4 * n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int i = 0; i < 4 * n && bad < 0; ++i)
            if (got[i] != want[i]) bad = i;
        CHECK("SIMD video intrinsics (__vsadu4, __vabsdiffu4, vabsdiff4 in inline asm, __vmaxu2, "
              "__vaddss4)", bad < 0, "element %ld: got %#x want %#x", bad,
              bad < 0 ? 0u : got[bad], bad < 0 ? 0u : want[bad]);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
}

static void test_grids()
{
    const int w = 100, h = 60;
    int *d2;
    REQUIRE(cudaMalloc(&d2, w * h * sizeof(int)));
    CUDA_OK(cudaMemset(d2, 0xff, w * h * sizeof(int)));
    dim3 block2(16, 16);
    dim3 grid2((w + 15) / 16, (h + 15) / 16);
    grid2d<<<grid2, block2>>>(d2, w, h);
    if (launched("grid2d")) {
        std::vector<int> got(w * h);
        CUDA_OK(cudaMemcpy(got.data(), d2, w * h * sizeof(int), cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int y = 0; y < h && bad < 0; ++y)
            for (int x = 0; x < w; ++x)
                if (got[y * w + x] != y * 10000 + x) { bad = y * w + x; break; }
        CHECK("2-D grid indexing (100 x 60, 16 x 16 blocks)", bad < 0, "element %ld = %d", bad,
              bad < 0 ? 0 : got[bad]);
    }
    cudaFree(d2);

    const int lanes = 300, per_block = 100;
    int *dl;
    REQUIRE(cudaMalloc(&dl, lanes * sizeof(int)));
    warp_lanes<<<lanes / per_block, per_block>>>(dl, lanes);
    if (launched("warp_lanes")) {
        std::vector<int> got(lanes);
        CUDA_OK(cudaMemcpy(got.data(), dl, lanes * sizeof(int), cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int t = 0; t < lanes && bad < 0; ++t) {
            int x = t % per_block;
            if (got[t] != 3200000 + (x / 32) * 100 + x % 32) bad = t;
        }
        CHECK("warpSize in a kernel is 32 (lanes and warps of 100-thread blocks)", bad < 0,
              "thread %ld: %d", bad, bad < 0 ? 0 : got[bad]);
    }
    cudaFree(dl);

    const int nx = 20, ny = 12, nz = 6;
    const int total = nx * ny * nz;
    int4 *d3;
    REQUIRE(cudaMalloc(&d3, total * sizeof(int4)));
    CUDA_OK(cudaMemset(d3, 0xff, total * sizeof(int4)));
    dim3 block3(8, 4, 2);
    dim3 grid3((nx + 7) / 8, (ny + 3) / 4, (nz + 1) / 2);
    grid3d<<<grid3, block3>>>(d3, nx, ny, nz);
    if (launched("grid3d")) {
        std::vector<int4> got(total);
        CUDA_OK(cudaMemcpy(got.data(), d3, total * sizeof(int4), cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int z = 0; z < nz && bad < 0; ++z)
            for (int y = 0; y < ny && bad < 0; ++y)
                for (int x = 0; x < nx; ++x) {
                    int4 v = got[(z * ny + y) * nx + x];
                    int fb = ((z / 2) * grid3.y + (y / 4)) * grid3.x + (x / 8);
                    if (v.x != x || v.y != y || v.z != z || v.w != fb) {
                        bad = (z * ny + y) * nx + x;
                        break;
                    }
                }
        CHECK("3-D grid indexing (20 x 12 x 6, 8 x 4 x 2 blocks)", bad < 0,
              "element %ld = (%d, %d, %d, %d)", bad, bad < 0 ? 0 : got[bad].x,
              bad < 0 ? 0 : got[bad].y, bad < 0 ? 0 : got[bad].z, bad < 0 ? 0 : got[bad].w);
    }
    cudaFree(d3);
}

static void test_params_constants_functions()
{
    float *dst;
    REQUIRE(cudaMalloc(&dst, 16 * sizeof(float)));
    CUDA_OK(cudaMemset(dst, 0, 16 * sizeof(float)));
    Params p;
    memset(&p, 0, sizeof p);
    p.c = -5;
    p.d = 1234.5;
    p.s = -300;
    p.v = make_int3(1, 20, 300);
    p.dst = dst;
    unsigned long long u = (123ull << 40) | 0xbeefull;
    params_kernel<<<1, 32>>>(p, (char)77, -0.125, u, (short)-32000);
    if (launched("params_kernel")) {
        float got[9];
        CUDA_OK(cudaMemcpy(got, dst, sizeof got, cudaMemcpyDeviceToHost));
        const float want[9] = {-5.0f, 1234.5f, -300.0f, 321.0f, 77.0f,
                               -0.125f, 123.0f, (float)0xbeef, -32000.0f};
        long bad = first_mismatch(got, want, 9);
        CHECK("by-value struct and mixed scalar parameters", bad < 0, "field %ld: got %g want %g",
              bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    }
    cudaFree(dst);

    const int n = 500;
    const int table[8] = {5, -3, 8, 13, -21, 34, 55, -89};
    std::vector<int> idx(n), got(n);
    for (int i = 0; i < n; ++i) idx[i] = i * 3 + 1;
    int *didx, *dout, *dhits;
    REQUIRE(cudaMalloc(&didx, n * sizeof(int)));
    REQUIRE(cudaMalloc(&dout, n * sizeof(int)));
    REQUIRE(cudaMalloc(&dhits, sizeof(int)));
    CUDA_OK(cudaMemcpy(didx, idx.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    constant_lookup<<<(n + 127) / 128, 128>>>(didx, dout, n);
    read_hits<<<1, 1>>>(dhits);
    if (launched("constant_lookup")) {
        CUDA_OK(cudaMemcpy(got.data(), dout, n * sizeof(int), cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int i = 0; i < n; ++i)
            if (got[i] != table[idx[i] & 7]) { bad = i; break; }
        CHECK("__constant__ table initializer", bad < 0, "index %ld: got %d want %d", bad,
              bad < 0 ? 0 : got[bad], bad < 0 ? 0 : table[idx[bad] & 7]);
        int hits = -1;
        CUDA_OK(cudaMemcpy(&hits, dhits, sizeof(int), cudaMemcpyDeviceToHost));
        CHECK("__device__ global is zero-initialised and shared across launches", hits == n,
              "got %d want %d", hits, n);
    }
    cudaFree(didx);
    cudaFree(dout);
    cudaFree(dhits);

    std::vector<float> x(256), y(256), want(256);
    for (int i = 0; i < 256; ++i) {
        x[i] = (float)(i - 128) / 16.0f;
        want[i] = (x[i] * x[i] - 2.0f) * x[i] + 1.0f;
    }
    float *dx, *dy;
    REQUIRE(cudaMalloc(&dx, 256 * sizeof(float)));
    REQUIRE(cudaMalloc(&dy, 256 * sizeof(float)));
    CUDA_OK(cudaMemcpy(dx, x.data(), 256 * sizeof(float), cudaMemcpyHostToDevice));
    call_device_function<<<2, 128>>>(dx, dy, 256);
    if (launched("call_device_function")) {
        CUDA_OK(cudaMemcpy(y.data(), dy, 256 * sizeof(float), cudaMemcpyDeviceToHost));
        long bad = first_mismatch_tol(y.data(), want.data(), 256, 1e-5f);
        CHECK("__noinline__ __device__ function call", bad < 0, "index %ld: got %g want %g", bad,
              bad < 0 ? 0.0 : y[bad], bad < 0 ? 0.0 : want[bad]);
    }
    cudaFree(dx);
    cudaFree(dy);
}

static void test_managed_variables()
{
    CHECK("__managed__ initializer seen by the host", m_counter == 5 && m_values[3] == 4.0f,
          "counter %d values[3] %g", m_counter, m_values[3]);
    m_counter = 10; // a host write the next launch sees
    bump_managed<<<2, 32>>>(1);
    if (launched("bump_managed")) {
        CUDA_OK(cudaDeviceSynchronize());
        CHECK("a kernel's updates to __managed__ variables reach the host",
              m_counter == 10 + 64 && m_values[0] == 2.0f && m_values[3] == 8.0f,
              "counter %d values %g %g", m_counter, m_values[0], m_values[3]);
    }
    int *p = nullptr;
    CHECK_CUDA("cudaGetSymbolAddress of a __managed__ variable",
               cudaGetSymbolAddress((void **)&p, m_counter));
    CHECK("its symbol address is the host's address", p == &m_counter, "%p vs %p", (void *)p,
          (void *)&m_counter);
    int from_device = -1;
    CUDA_OK(cudaMemcpyFromSymbol(&from_device, m_counter, sizeof(int)));
    CHECK("cudaMemcpyFromSymbol reads it", from_device == m_counter, "got %d want %d",
          from_device, m_counter);
}

static void test_launch_errors()
{
    int *d;
    REQUIRE(cudaMalloc(&d, 256 * sizeof(int)));
    CUDA_OK(cudaMemset(d, 0, 256 * sizeof(int)));

    // 2048 threads per block exceeds every device's limit (1024).
    grid2d<<<1, dim3(2048, 1)>>>(d, 256, 1);
    cudaError_t e = cudaGetLastError();
    CHECK("launch with 2048 threads per block fails", e != cudaSuccess, "returned cudaSuccess");
    printf("# oversize block launch returned %s (%d)\n", cudaGetErrorName(e), (int)e);
    CHECK("oversize block reports cudaErrorInvalidConfiguration or cudaErrorInvalidValue",
          e == cudaErrorInvalidConfiguration || e == cudaErrorInvalidValue, "%s (%d)",
          cudaGetErrorName(e), (int)e);

    // Too much dynamic shared memory (1 MiB).
    block_sum_dynamic<<<1, 32, 1 << 20>>>((const float *)d, (float *)d, 32);
    e = cudaGetLastError();
    CHECK("launch with 1 MiB dynamic shared memory fails", e != cudaSuccess,
          "returned cudaSuccess");
    printf("# 1 MiB shared memory launch returned %s (%d)\n", cudaGetErrorName(e), (int)e);
    if (e == cudaSuccess) {
        // Accepted anyway: let it finish (or fail) here, not in the next check.
        e = cudaDeviceSynchronize();
        printf("# ... and cudaDeviceSynchronize returned %s (%d)\n", cudaGetErrorName(e), (int)e);
        cudaGetLastError();
    }

    // A zero-sized grid is an invalid configuration.
    grid2d<<<dim3(0, 1), 32>>>(d, 256, 1);
    e = cudaGetLastError();
    CHECK("launch with an empty grid fails", e != cudaSuccess, "returned cudaSuccess");

    // Not sticky: a good launch still works.
    grid2d<<<1, dim3(256, 1)>>>(d, 256, 1);
    if (launched("launch after launch errors")) {
        int got[256];
        CUDA_OK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
        long bad = -1;
        for (int i = 0; i < 256; ++i)
            if (got[i] != i) { bad = i; break; }
        CHECK("launch after launch errors", bad < 0, "element %ld = %d", bad,
              bad < 0 ? 0 : got[bad]);
    }
    cudaFree(d);
}

static void test_virtual_calls()
{
    const int n = 200;
    int *d = nullptr;
    if (!CUDA_OK(cudaMalloc(&d, 3 * n * sizeof(int)))) return;
    virtual_calls<<<(n + 63) / 64, 64>>>(d, d + n, d + 2 * n, n);
    if (launched("virtual functions and function pointers")) {
        std::vector<int> h(3 * n);
        CUDA_OK(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = -1;
        for (int i = 0; i < n && bad < 0; ++i) {
            int legs = i % 3 == 0 ? 4 : i % 3 == 1 ? 2 : 0;
            int sound = i % 3 == 0 ? 14 : i % 3 == 1 ? 7 : i - 7;
            int op = i % 3 == 0 ? i + 100 : i % 3 == 1 ? (i > 100 ? i : 100) : (i ^ 100);
            if (h[i] != legs || h[n + i] != sound || h[2 * n + i] != op) bad = i;
        }
        CHECK("virtual functions and a table of function pointers", bad < 0, "thread %d: %d %d %d", bad,
              bad < 0 ? 0 : h[bad], bad < 0 ? 0 : h[n + bad], bad < 0 ? 0 : h[2 * n + bad]);
    }
    cudaFree(d);
}

int main()
{
    g_program = "kernels";
    if (!device_present())
        return finish();
    test_vector_add();
    test_saxpy();
    test_axpb<float>("template axpb<float>", 1.5f, -0.25f);
    test_axpb<int>("template axpb<int>", -3, 17);
    test_reductions();
    test_histograms();
    test_grids();
    test_simd_video();
    test_params_constants_functions();
    test_managed_variables();
    test_launch_errors();
    test_virtual_calls();
    return finish();
}
