// The device heap: kernels' malloc and free and C++ new and delete. The heap's size as
// cudaDeviceGetLimit reports it and cudaDeviceSetLimit sets it (before the first kernel that uses
// it, and refused after), memory that outlives the launch that allocated it, a thread freeing
// what another allocated, NULL when the heap is full and room again once freed, a linked list of
// objects built with new and torn down with delete, and the heap counted in the device's memory.
#include "check.h"

#include <set>
#include <vector>

constexpr size_t HEAP = 1 << 20;
constexpr int INTS = 250;  // 1000 bytes per allocation

__global__ void alloc_fill(int **ptrs, int *nulls)
{
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int *p = static_cast<int *>(malloc(INTS * sizeof(int)));
    ptrs[tid] = p;
    if (p == nullptr) {
        atomicAdd(nulls, 1);
        return;
    }
    for (int i = 0; i < INTS; i++) p[i] = tid * 3 + i;
}

// Sums what a thread's allocation holds into sums[tid] and frees the allocation of the next
// thread (wrapping), so every allocation is freed by another thread than its own.
__global__ void sum_and_free_next(int **ptrs, long long *sums, int n)
{
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    long long s = -1;
    if (int *p = ptrs[tid]) {
        s = 0;
        for (int i = 0; i < INTS; i++) s += p[i];
    }
    sums[tid] = s;
    __syncthreads();
    // Every block's sums are written before any pointer is freed: blocks free only their own
    // threads' neighbours, the last thread of a block its block's first.
    int first = blockIdx.x * blockDim.x;
    int next = first + (threadIdx.x + 1) % blockDim.x;
    if (next < n) free(ptrs[next]);
}

struct Node {
    long long value;
    Node *next;
    __device__ explicit Node(long long v, Node *n) : value(v), next(n) {}
    __device__ ~Node() { value = -1; }
};

__global__ void linked_list(int len, long long *out)
{
    Node *head = nullptr;
    for (int i = 1; i <= len; i++) {
        Node *n = new Node(i * (threadIdx.x + 1), head);
        if (n == nullptr) {
            out[threadIdx.x] = -1;
            return;
        }
        head = n;
    }
    long long s = 0;
    while (head != nullptr) {
        Node *next = head->next;
        s += head->value;
        delete head;
        head = next;
    }
    out[threadIdx.x] = s;
}

int main()
{
    g_program = "device_heap";
    size_t limit = 0;
    REQUIRE(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize));
    CHECK("the device heap is 8 MiB by default", limit == (8u << 20), "%zu", limit);
    CHECK_CUDA("cudaDeviceSetLimit(cudaLimitMallocHeapSize, 1 MiB)", cudaDeviceSetLimit(cudaLimitMallocHeapSize, HEAP));
    REQUIRE(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize));
    CHECK("cudaDeviceGetLimit reports the heap size set", limit == HEAP, "%zu", limit);

    size_t free_before = 0, total = 0;
    REQUIRE(cudaMemGetInfo(&free_before, &total));

    // 256 threads of 1000 bytes fit the 1 MiB heap.
    const int blocks = 4, threads = 64, n = blocks * threads;
    int **ptrs = nullptr, *nulls = nullptr;
    long long *sums = nullptr;
    REQUIRE(cudaMalloc(&ptrs, 4096 * sizeof(int *)));
    REQUIRE(cudaMalloc(&nulls, sizeof(int)));
    REQUIRE(cudaMalloc(&sums, 4096 * sizeof(long long)));
    REQUIRE(cudaMemset(nulls, 0, sizeof(int)));
    alloc_fill<<<blocks, threads>>>(ptrs, nulls);
    CHECK_CUDA("a kernel that calls malloc launches", cudaGetLastError());
    CHECK_CUDA("and completes", cudaDeviceSynchronize());
    int h_nulls = -1;
    REQUIRE(cudaMemcpy(&h_nulls, nulls, sizeof h_nulls, cudaMemcpyDeviceToHost));
    std::vector<int *> h_ptrs(n);
    REQUIRE(cudaMemcpy(h_ptrs.data(), ptrs, n * sizeof(int *), cudaMemcpyDeviceToHost));
    std::set<uintptr_t> distinct;
    bool aligned = true;
    for (int *p : h_ptrs) {
        distinct.insert(reinterpret_cast<uintptr_t>(p));
        aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
    }
    CHECK("every thread's malloc succeeds", h_nulls == 0, "%d NULL", h_nulls);
    CHECK("each thread gets its own 16-byte aligned block", distinct.size() == size_t(n) && aligned && !distinct.count(0),
          "%zu distinct", distinct.size());

    size_t free_after = 0;
    REQUIRE(cudaMemGetInfo(&free_after, &total));
    CHECK("the heap is taken from the device's memory", free_before - free_after >= HEAP,
          "free %zu before, %zu after", free_before, free_after);

    cudaError_t e = cudaDeviceSetLimit(cudaLimitMallocHeapSize, 2 * HEAP);
    CHECK("the heap size cannot change after a kernel used it", e == cudaErrorInvalidValue, "%s",
          cudaGetErrorName(e));
    cudaGetLastError();

    // A later launch reads what the first one wrote, each allocation freed by another thread.
    sum_and_free_next<<<blocks, threads>>>(ptrs, sums, n);
    CHECK_CUDA("a later kernel reads and frees the allocations", cudaDeviceSynchronize());
    std::vector<long long> h_sums(n);
    REQUIRE(cudaMemcpy(h_sums.data(), sums, n * sizeof(long long), cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int t = 0; t < n && bad < 0; t++) {
        long long want = 0;
        for (int i = 0; i < INTS; i++) want += t * 3 + i;
        if (h_sums[t] != want) bad = t;
    }
    CHECK("heap memory keeps its contents across launches", bad < 0, "thread %d: %lld", bad,
          bad < 0 ? 0 : h_sums[bad]);

    // 4096 threads of 1000 bytes do not fit: some get NULL, the others their memory.
    REQUIRE(cudaMemset(nulls, 0, sizeof(int)));
    alloc_fill<<<64, 64>>>(ptrs, nulls);
    REQUIRE(cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(&h_nulls, nulls, sizeof h_nulls, cudaMemcpyDeviceToHost));
    CHECK("malloc answers NULL once the heap is full", h_nulls > 0 && h_nulls < 4096 && 4096 - h_nulls <= int(2 * HEAP / 1000),
          "%d of 4096 NULL", h_nulls);
    sum_and_free_next<<<64, 64>>>(ptrs, sums, 4096);
    REQUIRE(cudaDeviceSynchronize());
    std::vector<long long> big(4096);
    REQUIRE(cudaMemcpy(big.data(), sums, big.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    int got = 0;
    for (long long s : big) got += s >= 0;
    CHECK("the threads that got memory read it back", got == 4096 - h_nulls, "%d, want %d", got, 4096 - h_nulls);
    // Every allocation was freed (each block's threads free their neighbours in a ring): the
    // same 256 allocations fit again.
    REQUIRE(cudaMemset(nulls, 0, sizeof(int)));
    alloc_fill<<<blocks, threads>>>(ptrs, nulls);
    REQUIRE(cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(&h_nulls, nulls, sizeof h_nulls, cudaMemcpyDeviceToHost));
    CHECK("freed memory can be allocated again", h_nulls == 0, "%d NULL", h_nulls);
    sum_and_free_next<<<blocks, threads>>>(ptrs, sums, n);
    REQUIRE(cudaDeviceSynchronize());

    long long *out = nullptr;
    REQUIRE(cudaMalloc(&out, 32 * sizeof(long long)));
    linked_list<<<1, 32>>>(100, out);
    CHECK_CUDA("new and delete in a kernel", cudaDeviceSynchronize());
    std::vector<long long> lists(32);
    REQUIRE(cudaMemcpy(lists.data(), out, lists.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    bad = -1;
    for (int t = 0; t < 32 && bad < 0; t++)
        if (lists[t] != 5050LL * (t + 1)) bad = t;
    CHECK("a linked list built with new and torn down with delete", bad < 0, "thread %d: %lld", bad,
          bad < 0 ? 0 : lists[bad]);

    CUDA_OK(cudaFree(ptrs));
    CUDA_OK(cudaFree(nulls));
    CUDA_OK(cudaFree(sums));
    CUDA_OK(cudaFree(out));
    return finish_summary();
}
