// Thrust and CUB, the parallel algorithms most CUDA applications use (nvcc 11.8's Thrust and CUB
// 1.17, PTX for compute_52): sorts (radix sort of ints, floats and pairs; merge sort with a
// comparator), reductions, scans, stream compaction and partitions (decoupled look-back across
// blocks), searches, histograms, segmented reductions, run-length encoding, and CUB's block- and
// warp-wide collectives in a kernel of our own, each against the host's answer. CUB and Thrust
// size their tiles from the kernels' CU_FUNC_ATTRIBUTE_PTX_VERSION: before 2026-12-06 the
// simulated GPU reported the PTX ISA version there and every multi-tile reduction was wrong.
#include "check.h"

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/device_ptr.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/extrema.h>
#include <thrust/functional.h>
#include <thrust/host_vector.h>
#include <thrust/inner_product.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/partition.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>
#include <thrust/unique.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

// Enough elements for many tiles of every algorithm, few enough for the simulated GPU.
constexpr int N = 50000;

struct is_even {
    __host__ __device__ bool operator()(int x) const { return (x & 1) == 0; }
};
struct square {
    __host__ __device__ long long operator()(int x) const { return (long long)x * x; }
};
struct key_of {
    __host__ __device__ float operator()(int i) const { return float((i * 7919) % 1000) * 0.5f; }
};
// Orders by the last decimal digit, then by value: a comparator radix sort cannot take.
struct by_last_digit {
    __host__ __device__ bool operator()(int a, int b) const
    {
        int da = ((a % 10) + 10) % 10, db = ((b % 10) + 10) % 10;
        return da != db ? da < db : a < b;
    }
};

static std::vector<int> random_ints(int n, unsigned seed, int range)
{
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = int((seed >> 8) % unsigned(range)) - range / 2;
    }
    return v;
}

template <typename T>
static bool same(const std::vector<T> &want, const thrust::device_vector<T> &got, size_t n)
{
    thrust::host_vector<T> h(got.begin(), got.begin() + n);
    return n == want.size() && std::equal(want.begin(), want.end(), h.begin());
}

// CUB's collectives in a kernel of our own: each block sorts its 256 x 4 keys with
// BlockRadixSort, scans them with BlockScan, and warp 0 sums its lanes with WarpReduce.
__global__ void block_collectives(const int *in, int *sorted, int *scanned, int *warp_sums)
{
    typedef cub::BlockRadixSort<int, 256, 4> Sort;
    typedef cub::BlockScan<int, 256> Scan;
    typedef cub::WarpReduce<int> Warp;
    __shared__ union {
        typename Sort::TempStorage sort;
        typename Scan::TempStorage scan;
        typename Warp::TempStorage warp;
    } tmp;
    int keys[4];
    int base = blockIdx.x * 1024 + threadIdx.x * 4;
    for (int i = 0; i < 4; ++i) keys[i] = in[base + i];
    Sort(tmp.sort).Sort(keys);
    for (int i = 0; i < 4; ++i) sorted[base + i] = keys[i];
    __syncthreads();
    Scan(tmp.scan).InclusiveSum(keys, keys);
    for (int i = 0; i < 4; ++i) scanned[base + i] = keys[i];
    __syncthreads();
    if (threadIdx.x < 32) {
        int s = Warp(tmp.warp).Sum(in[blockIdx.x * 1024 + threadIdx.x]);
        if (threadIdx.x == 0) warp_sums[blockIdx.x] = s;
    }
}

int main()
{
    g_program = "thrust";
    const std::vector<int> h = random_ints(N, 12345, 200000);
    thrust::device_vector<int> d(h.begin(), h.end());

    // Radix sorts.
    std::vector<int> sorted = h;
    std::sort(sorted.begin(), sorted.end());
    thrust::device_vector<int> s = d;
    thrust::sort(s.begin(), s.end());
    CHECK("thrust::sort of ints (radix sort)", same(sorted, s, N), "differs");
    thrust::sort(s.begin(), s.end(), thrust::greater<int>());
    std::vector<int> desc(sorted.rbegin(), sorted.rend());
    CHECK("thrust::sort descending", same(desc, s, N), "differs");
    thrust::device_vector<float> keys(N);
    thrust::device_vector<int> vals(N);
    thrust::sequence(vals.begin(), vals.end());
    thrust::transform(vals.begin(), vals.end(), keys.begin(), key_of());
    thrust::stable_sort_by_key(keys.begin(), keys.end(), vals.begin());
    std::vector<int> idx(N);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [](int a, int b) { return key_of()(a) < key_of()(b); });
    CHECK("thrust::stable_sort_by_key of float keys (pairs, stable)", same(idx, vals, N), "differs");
    // Merge sort: a comparator.
    std::vector<int> by_digit = h;
    std::sort(by_digit.begin(), by_digit.end(), by_last_digit());
    thrust::device_vector<int> m = d;
    thrust::sort(m.begin(), m.end(), by_last_digit());
    CHECK("thrust::sort with a comparator (merge sort)", same(by_digit, m, N), "differs");

    // Reductions.
    long long sum = thrust::reduce(d.begin(), d.end(), 0LL);
    long long want_sum = std::accumulate(h.begin(), h.end(), 0LL);
    CHECK("thrust::reduce (64-bit sum over many tiles)", sum == want_sum, "%lld, want %lld", sum, want_sum);
    long long sq = thrust::transform_reduce(d.begin(), d.end(), square(), 0LL, thrust::plus<long long>());
    long long want_sq = 0;
    for (int x : h) want_sq += (long long)x * x;
    CHECK("thrust::transform_reduce", sq == want_sq, "%lld, want %lld", sq, want_sq);
    auto mm = thrust::minmax_element(d.begin(), d.end());
    auto hmm = std::minmax_element(h.begin(), h.end());
    CHECK("thrust::minmax_element", mm.first - d.begin() == hmm.first - h.begin() && mm.second - d.begin() == hmm.second - h.begin(),
          "%ld %ld", (long)(mm.first - d.begin()), (long)(mm.second - d.begin()));
    int dot = thrust::inner_product(d.begin(), d.begin() + 1000, d.begin() + 1000, 0);
    CHECK("thrust::inner_product", dot == std::inner_product(h.begin(), h.begin() + 1000, h.begin() + 1000, 0), "%d", dot);

    // Scans.
    thrust::device_vector<long long> sc(N);
    thrust::inclusive_scan(d.begin(), d.end(), sc.begin(), thrust::plus<long long>());
    std::vector<long long> want_sc(N);
    std::partial_sum(h.begin(), h.end(), want_sc.begin(), std::plus<long long>());
    CHECK("thrust::inclusive_scan (decoupled look-back)", same(want_sc, sc, N), "differs");
    thrust::device_vector<int> ex(N);
    thrust::exclusive_scan(d.begin(), d.end(), ex.begin(), 7);
    std::vector<int> want_ex(N);
    int run = 7;
    for (int i = 0; i < N; ++i) want_ex[i] = run, run += h[i];
    CHECK("thrust::exclusive_scan with an initial value", same(want_ex, ex, N), "differs");

    // Stream compaction, partitions, uniques.
    thrust::device_vector<int> ev(N);
    int kept = thrust::copy_if(d.begin(), d.end(), ev.begin(), is_even()) - ev.begin();
    std::vector<int> want_ev;
    std::copy_if(h.begin(), h.end(), std::back_inserter(want_ev), is_even());
    CHECK("thrust::copy_if keeps order", same(want_ev, ev, kept), "%d kept, want %zu", kept, want_ev.size());
    int evens = thrust::count_if(d.begin(), d.end(), is_even());
    CHECK("thrust::count_if", evens == int(want_ev.size()), "%d", evens);
    thrust::device_vector<int> p = d;
    int first_odd = thrust::stable_partition(p.begin(), p.end(), is_even()) - p.begin();
    std::vector<int> want_p = h;
    std::stable_partition(want_p.begin(), want_p.end(), is_even());
    CHECK("thrust::stable_partition", first_odd == evens && same(want_p, p, N), "%d", first_odd);
    thrust::device_vector<int> u(sorted.begin(), sorted.end());
    int uniq = thrust::unique(u.begin(), u.end()) - u.begin();
    std::vector<int> want_u = sorted;
    want_u.erase(std::unique(want_u.begin(), want_u.end()), want_u.end());
    CHECK("thrust::unique", same(want_u, u, uniq), "%d, want %zu", uniq, want_u.size());

    // Reductions by key and searches on the sorted keys.
    thrust::device_vector<int> digit_keys(N), digit_sums(N), out_keys(10);
    std::vector<int> hk(N);
    for (int i = 0; i < N; ++i) hk[i] = i * 10 / N;  // ten runs
    thrust::copy(hk.begin(), hk.end(), digit_keys.begin());
    auto ends = thrust::reduce_by_key(digit_keys.begin(), digit_keys.end(), d.begin(), out_keys.begin(), digit_sums.begin());
    std::vector<int> want_rk(10, 0);
    for (int i = 0; i < N; ++i) want_rk[hk[i]] += h[i];
    CHECK("thrust::reduce_by_key", ends.first - out_keys.begin() == 10 && same(want_rk, digit_sums, 10), "differs");
    thrust::device_vector<int> sd(sorted.begin(), sorted.end()), probes(h.begin(), h.begin() + 1000), pos(1000);
    thrust::lower_bound(sd.begin(), sd.end(), probes.begin(), probes.end(), pos.begin());
    std::vector<int> want_pos(1000);
    for (int i = 0; i < 1000; ++i) want_pos[i] = std::lower_bound(sorted.begin(), sorted.end(), h[i]) - sorted.begin();
    CHECK("thrust::lower_bound (vectorized)", same(want_pos, pos, 1000), "differs");

    // Thrust on a stream of our own, on memory from cudaMalloc.
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int *raw = nullptr;
    CUDA_OK(cudaMalloc(&raw, N * sizeof(int)));
    CUDA_OK(cudaMemcpyAsync(raw, h.data(), N * sizeof(int), cudaMemcpyHostToDevice, st));
    thrust::device_ptr<int> rp(raw);
    thrust::sort(thrust::cuda::par.on(st), rp, rp + N);
    std::vector<int> back(N);
    CUDA_OK(cudaMemcpyAsync(back.data(), raw, N * sizeof(int), cudaMemcpyDeviceToHost, st));
    CUDA_OK(cudaStreamSynchronize(st));
    CHECK("thrust::sort on a non-blocking stream", back == sorted, "differs");

    // CUB's device-wide algorithms with their temporary storage.
    {
        void *tmp = nullptr;
        size_t bytes = 0, need = 0;
        int *hist = nullptr, *offsets = nullptr, *seg = nullptr, *ukeys = nullptr, *counts = nullptr, *nruns = nullptr;
        CUDA_OK(cudaMalloc(&hist, 16 * sizeof(int)));
        CUDA_OK(cudaMalloc(&offsets, 11 * sizeof(int)));
        CUDA_OK(cudaMalloc(&seg, 10 * sizeof(int)));
        CUDA_OK(cudaMalloc(&ukeys, N * sizeof(int)));
        CUDA_OK(cudaMalloc(&counts, N * sizeof(int)));
        CUDA_OK(cudaMalloc(&nruns, sizeof(int)));
        const int *in = thrust::raw_pointer_cast(d.data());
        // Sizes first, then one buffer for all.
        cub::DeviceHistogram::HistogramEven(nullptr, need, in, hist, 17, -100000, 100000, N);
        bytes = std::max(bytes, need);
        std::vector<int> hoff(11);
        for (int i = 0; i <= 10; ++i) hoff[i] = i * N / 10;
        CUDA_OK(cudaMemcpy(offsets, hoff.data(), 11 * sizeof(int), cudaMemcpyHostToDevice));
        cub::DeviceSegmentedReduce::Sum(nullptr, need, in, seg, 10, offsets, offsets + 1);
        bytes = std::max(bytes, need);
        const int *sorted_in = thrust::raw_pointer_cast(sd.data());
        cub::DeviceRunLengthEncode::Encode(nullptr, need, sorted_in, ukeys, counts, nruns, N);
        bytes = std::max(bytes, need);
        CUDA_OK(cudaMalloc(&tmp, bytes));

        cub::DeviceHistogram::HistogramEven(tmp, bytes, in, hist, 17, -100000, 100000, N);
        std::vector<int> gh(16), want_h(16, 0);
        CUDA_OK(cudaMemcpy(gh.data(), hist, 16 * sizeof(int), cudaMemcpyDeviceToHost));
        for (int x : h) want_h[(x + 100000) / 12500]++;
        CHECK("cub::DeviceHistogram::HistogramEven", gh == want_h, "differs");

        cub::DeviceSegmentedReduce::Sum(tmp, bytes, in, seg, 10, offsets, offsets + 1);
        std::vector<int> gs(10), want_s(10, 0);
        CUDA_OK(cudaMemcpy(gs.data(), seg, 10 * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; ++i) want_s[i * 10 / N] += h[i];
        CHECK("cub::DeviceSegmentedReduce::Sum", gs == want_s, "differs");

        cub::DeviceRunLengthEncode::Encode(tmp, bytes, sorted_in, ukeys, counts, nruns, N);
        int runs = 0;
        CUDA_OK(cudaMemcpy(&runs, nruns, sizeof(int), cudaMemcpyDeviceToHost));
        std::vector<int> gk(runs > 0 && runs <= N ? runs : 1), gc(gk.size());
        CUDA_OK(cudaMemcpy(gk.data(), ukeys, gk.size() * sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gc.data(), counts, gc.size() * sizeof(int), cudaMemcpyDeviceToHost));
        std::vector<int> want_c;
        for (size_t i = 0; i < sorted.size();) {
            size_t j = i;
            while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
            want_c.push_back(int(j - i));
            i = j;
        }
        CHECK("cub::DeviceRunLengthEncode::Encode", runs == int(want_u.size()) && gk == want_u && gc == want_c,
              "%d runs, want %zu", runs, want_u.size());
        for (void *q : {(void *)hist, (void *)offsets, (void *)seg, (void *)ukeys, (void *)counts, (void *)nruns, tmp})
            CUDA_OK(cudaFree(q));
    }

    // Block- and warp-wide collectives.
    {
        const int blocks = 8;
        int *in = nullptr, *bs = nullptr, *bscan = nullptr, *ws = nullptr;
        CUDA_OK(cudaMalloc(&in, blocks * 1024 * sizeof(int)));
        CUDA_OK(cudaMalloc(&bs, blocks * 1024 * sizeof(int)));
        CUDA_OK(cudaMalloc(&bscan, blocks * 1024 * sizeof(int)));
        CUDA_OK(cudaMalloc(&ws, blocks * sizeof(int)));
        CUDA_OK(cudaMemcpy(in, h.data(), blocks * 1024 * sizeof(int), cudaMemcpyHostToDevice));
        block_collectives<<<blocks, 256>>>(in, bs, bscan, ws);
        CUDA_OK(cudaGetLastError());
        std::vector<int> gbs(blocks * 1024), gscan(blocks * 1024), gws(blocks);
        CUDA_OK(cudaMemcpy(gbs.data(), bs, gbs.size() * sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gscan.data(), bscan, gscan.size() * sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gws.data(), ws, gws.size() * sizeof(int), cudaMemcpyDeviceToHost));
        bool sort_ok = true, scan_ok = true, warp_ok = true;
        for (int b = 0; b < blocks; ++b) {
            std::vector<int> part(h.begin() + b * 1024, h.begin() + (b + 1) * 1024);
            std::sort(part.begin(), part.end());
            sort_ok &= std::equal(part.begin(), part.end(), gbs.begin() + b * 1024);
            std::partial_sum(part.begin(), part.end(), part.begin());
            scan_ok &= std::equal(part.begin(), part.end(), gscan.begin() + b * 1024);
            warp_ok &= gws[b] == std::accumulate(h.begin() + b * 1024, h.begin() + b * 1024 + 32, 0);
        }
        CHECK("cub::BlockRadixSort", sort_ok, "differs");
        CHECK("cub::BlockScan::InclusiveSum", scan_ok, "differs");
        CHECK("cub::WarpReduce::Sum", warp_ok, "differs");
        for (int *q : {in, bs, bscan, ws}) CUDA_OK(cudaFree(q));
    }
    CUDA_OK(cudaFree(raw));
    CUDA_OK(cudaStreamDestroy(st));
    return finish();
}
