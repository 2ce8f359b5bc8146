"""CuPy on vgpu: arrays, elementwise arithmetic, reductions and the kernels
CuPy compiles at run time (ElementwiseKernel, ReductionKernel, RawKernel; a RawModule whose
kernels use the device heap and virtual functions),
a CUDA array sampled through a texture object and written through a surface
(cupy.cuda.texture), cuBLAS's level-1 reductions, and CuPy's CUB (reductions, scans, histograms: its default reduction
accelerator) and Thrust (sorts) modules, whose only PTX is for compute 10.0, and cupy.random
(cuRAND, whose only PTX is for compute 9.0), each result checked against NumPy. Run through vgpu's libcuda.so.1 with CUPY_COMPILE_WITH_PTX=1 (NVRTC emits PTX,
which the simulated GPU runs). Prints one line per check and PASS at the end; exits 1 on the
first failure.
"""

import sys

import cupy as cp
import numpy as np

checks = 0


def check(what, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        print(f"FAIL {what} {detail}")
        sys.exit(1)
    print(f"ok {what}")


def close(what, got, want, rtol=1e-5):
    got = cp.asnumpy(got) if isinstance(got, cp.ndarray) else got
    check(what, np.allclose(got, want, rtol=rtol), f"got {got!r}, want {want!r}")


# Devices and memory: the VM's slice.
check("one device", cp.cuda.runtime.getDeviceCount() == 1)
free, total = cp.cuda.runtime.memGetInfo()
check("memGetInfo reports the slice", total == int(sys.argv[1]) and 0 < free <= total,
      f"free {free} total {total}")
props = cp.cuda.runtime.getDeviceProperties(0)
check("device properties", props["major"] >= 5 and props["multiProcessorCount"] > 0)

# Creation and copies.
h = np.arange(1000, dtype=np.float32)
a = cp.asarray(h)
close("host to device and back", a, h)
close("arange", cp.arange(10, dtype=cp.int32), np.arange(10, dtype=np.int32))
close("zeros/ones", cp.zeros(5) + cp.ones(5), np.ones(5))
close("linspace", cp.linspace(0, 1, 11), np.linspace(0, 1, 11))
close("full", cp.full((3, 4), 7.5), np.full((3, 4), 7.5))

# Elementwise arithmetic, ufuncs and broadcasting.
close("a * 2 + 1", a * 2 + 1, h * 2 + 1)
close("sin/exp", cp.sin(a[:50]) + cp.exp(a[:5].sum() * 0), np.sin(h[:50]) + 1)
m = cp.arange(12, dtype=cp.float64).reshape(3, 4)
mh = np.arange(12, dtype=np.float64).reshape(3, 4)
close("broadcast", m + cp.arange(4), mh + np.arange(4))
close("where", cp.where(a > 500, a, -a), np.where(h > 500, h, -h))
close("int64 floor division", cp.arange(100) // 7, np.arange(100) // 7)
close("transpose copy", cp.ascontiguousarray(m.T), mh.T)

# CuPy's JIT-compiled CUB block reductions (its "reduction accelerator") build CUB's headers
# with NVRTC, and on these machines CuPy takes the CUDA 13 wheel's headers to CUDA 12's NVRTC,
# which fails to compile them, GPU or not: off. The device-wide CUB routines below stay on.
from cupy._core import _accelerator

_accelerator.set_reduction_accelerators([])

# Reductions (CUB's device-wide routines where CuPy uses them, as by default; else CuPy's own).
close("sum", a.sum(), h.sum(), rtol=1e-4)
close("max/min", cp.stack([a.max(), a.min()]), [h.max(), h.min()])
close("mean", a.mean(), h.mean(), rtol=1e-4)
close("argmax", cp.argmax(cp.sin(a)), np.argmax(np.sin(h)))
close("sum over an axis", m.sum(axis=0), mh.sum(axis=0))
close("prod over an axis", m[:, 1:3].prod(axis=1), mh[:, 1:3].prod(axis=1))
close("count_nonzero", cp.count_nonzero(a % 3 == 0), np.count_nonzero(h % 3 == 0))

# CuPy's CUB and Thrust modules: cubins for ten architectures and PTX for compute 10.0 only,
# which the simulated GPU runs (before, CUB's reductions returned garbage and sorts failed).
if _accelerator.ACCELERATOR_CUB in _accelerator.get_routine_accelerators():
    rng = np.random.default_rng(7)
    r = rng.standard_normal(50000).astype(np.float32)
    x = cp.asarray(r)
    close("CUB sum", x.sum(), r.sum(dtype=np.float64), rtol=1e-4)
    check("CUB argmax", int(x.argmax()) == int(r.argmax()))
    close("CUB cumsum", cp.cumsum(cp.arange(1000, dtype=cp.int64)), np.cumsum(np.arange(1000)))
    counts, _ = cp.histogram(x, bins=10)
    check("CUB histogram", np.array_equal(counts.get(), np.histogram(r, bins=10)[0]))
    check("Thrust sort", np.array_equal(cp.sort(x).get(), np.sort(r)))
    check("Thrust argsort", np.array_equal(cp.argsort(x).get(), np.argsort(r, kind="stable")))
    keys = rng.integers(0, 5, (2, 1000))
    check("Thrust lexsort", np.array_equal(cp.lexsort(cp.asarray(keys)).get(), np.lexsort(keys)))

# cuBLAS's level-1 reductions (cupy.dot of vectors, cupy.cublas), whose result buffers cuBLAS
# keeps per stream (it asks the driver's CUDA 13 tools table which stream it has), and
# cupy.linalg.norm.
v = cp.arange(64, dtype=cp.float32)
vh = np.arange(64, dtype=np.float32)
close("cupy.dot of vectors (cublasSdot)", cp.dot(v, v), np.dot(vh, vh))
close("cupy.linalg.norm", cp.linalg.norm(v), np.linalg.norm(vh))
from cupy import cublas  # noqa: E402

close("cupy.cublas.asum", cublas.asum(v), np.abs(vh).sum())
check("cupy.cublas.iamax", int(cublas.iamax(v)) == 64, f"{int(cublas.iamax(v))}")

# cupy.random through cuRAND (Debian's libcurand 10.3: cubins and compute 9.0 PTX, which the
# simulated GPU runs): uniform and normal draws with the right moments, the same draws again
# after the same seed, and CuPy's own generator (cupy.random.default_rng).
cp.random.seed(5)
u = cp.random.rand(100000)
check("cuRAND uniform draws", 0 <= float(u.min()) and float(u.max()) < 1
      and abs(float(u.mean()) - 0.5) < 0.01, f"{float(u.mean())}")
cp.random.seed(5)
check("the same seed, the same draws", np.array_equal(cp.random.rand(100000).get(), u.get()))
z = cp.random.standard_normal(100000)
check("cuRAND normal draws", abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02,
      f"{float(z.mean())} {float(z.std())}")
g = cp.random.default_rng(1).random(100000)
check("CuPy's generator", abs(float(g.mean()) - 0.5) < 0.01, f"{float(g.mean())}")

# Kernels compiled at run time.
sqdiff = cp.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "vgpu_sqdiff")
close("ElementwiseKernel", sqdiff(a, a[::-1].copy()), (h - h[::-1]) ** 2)
l2 = cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "vgpu_l2norm")
close("ReductionKernel", l2(a), np.sqrt((h.astype(np.float64) ** 2).sum()), rtol=1e-4)
raw = cp.RawKernel(r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
''', "saxpy")
y = cp.ones(1000, dtype=cp.float32)
raw(((1000 + 127) // 128,), (128,), (cp.float32(3), a, y, cp.int32(1000)))
close("RawKernel", y, 3 * h + 1)
mod = cp.RawModule(code=r'''
template<typename T> __global__ void fill(T* p, T v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}
''', options=("-std=c++14",), name_expressions=("fill<int>",))
z = cp.zeros(300, dtype=cp.int32)
mod.get_function("fill<int>")((3,), (128,), (z, cp.int32(42), cp.int32(300)))
close("RawModule template", z, np.full(300, 42))

# A RawModule whose kernels allocate on the device heap and call virtual functions.
objs = cp.RawModule(code=r'''
struct Op { __device__ virtual int apply(int x) const = 0; __device__ virtual ~Op() {} };
struct Twice : Op { __device__ int apply(int x) const override { return 2 * x; } };
struct Square : Op { __device__ int apply(int x) const override { return x * x; } };
extern "C" __global__ void objects(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Op *op = i % 2 ? (Op *)new Square : (Op *)new Twice;
    int *tmp = (int *)malloc(4 * sizeof(int));
    if (op == nullptr || tmp == nullptr) { out[i] = -1; return; }
    for (int k = 0; k < 4; k++) tmp[k] = op->apply(i + k);
    out[i] = tmp[0] + tmp[3];
    free(tmp);
    delete op;
}
''')
o = cp.zeros(256, dtype=cp.int32)
objs.get_function("objects")((2,), (128,), (o, cp.int32(256)))
idx = np.arange(256)
close("device new, malloc and virtual functions in a RawModule", o,
      np.where(idx % 2 == 1, idx ** 2 + (idx + 3) ** 2, 2 * idx + 2 * (idx + 3)))

# Streams and events.
s = cp.cuda.Stream(non_blocking=True)
with s:
    b = a * 3
    e = s.record()
e.synchronize()
s.synchronize()
close("work on a non-blocking stream", b, h * 3)
start, end = cp.cuda.Event(), cp.cuda.Event()
start.record()
c = (a * a).sum()
end.record()
end.synchronize()
check("event timing", cp.cuda.get_elapsed_time(start, end) >= 0)

# Textures and surfaces (cupy.cuda.texture): a CUDA array sampled with linear filtering and
# clamping, then doubled in place through a surface object.
from cupy.cuda import runtime, texture

src = np.arange(32, dtype=np.float32).reshape(4, 8) * 3
fmt = texture.ChannelFormatDescriptor(32, 0, 0, 0, runtime.cudaChannelFormatKindFloat)
carr = texture.CUDAarray(fmt, 8, 4, 0, runtime.cudaArraySurfaceLoadStore)
carr.copy_from(src)
back = np.zeros_like(src)
carr.copy_to(back)
check("a CUDA array holds what was copied in", np.array_equal(back, src))
rdesc = texture.ResourceDescriptor(runtime.cudaResourceTypeArray, cuArr=carr)
tdesc = texture.TextureDescriptor(
    (runtime.cudaAddressModeClamp, runtime.cudaAddressModeClamp),
    runtime.cudaFilterModeLinear, runtime.cudaReadModeElementType)
tobj = texture.TextureObject(rdesc, tdesc)
tex_mod = cp.RawModule(code=r"""
extern "C" __global__ void sample(cudaTextureObject_t t, float* out, int w) {
    int x = threadIdx.x, y = blockIdx.x;
    out[y * w + x] = tex2D<float>(t, x + 1.0f, y + 0.5f);
}
extern "C" __global__ void twice(cudaSurfaceObject_t s) {
    int x = threadIdx.x, y = blockIdx.x;
    float v = surf2Dread<float>(s, x * 4, y);
    surf2Dwrite(v * 2.0f, s, x * 4, y);
}
""")
sampled = cp.zeros((4, 8), dtype=cp.float32)
tex_mod.get_function("sample")((4,), (8,), (tobj, sampled, cp.int32(8)))
# Half way between texel x and x + 1; the last column's neighbour is clamped to itself.
want = (src + np.concatenate([src[:, 1:], src[:, -1:]], axis=1)) / 2
close("tex2D with linear filtering and clamping", sampled, want)
sobj = texture.SurfaceObject(rdesc)
tex_mod.get_function("twice")((4,), (8,), (sobj,))
carr.copy_to(back)
check("surf2Dread and surf2Dwrite double the array", np.array_equal(back, src * 2),
      f"got {back!r}")
del sobj, tobj

# Memory is charged to the slice and returns to it.
big = cp.empty(32 << 20, dtype=cp.uint8)
free_mid, _ = cp.cuda.runtime.memGetInfo()
check("an allocation is charged to the slice", free_mid <= free - (32 << 20), f"{free_mid}")
del big
cp.get_default_memory_pool().free_all_blocks()
free_end, _ = cp.cuda.runtime.memGetInfo()
check("freed memory returns to the slice", free_end >= free_mid + (32 << 20), f"{free_end}")

print(f"PASS {checks} checks")
