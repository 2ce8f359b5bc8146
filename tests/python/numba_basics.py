"""numba-cuda on vgpu: @cuda.jit kernels with shared memory, atomics, raw
pointer arguments, device functions, device arrays, streams, events, pinned,
mapped and managed host memory, and a register limit, each result checked against
NumPy, and cooperative groups' grid.sync(). numba compiles with NVVM (PyPI's
nvidia-cuda-nvcc-cu12) and, without nvJitLink installed, links through the
driver's cuLink* API, which vgpu answers with PTX the simulated GPU runs
(taking from CUDA's libcudadevrt.a the PTX of what a kernel calls). Prints one line per check and PASS
at the end; exits 1 on the first failure.
"""

import os
import sys
import warnings

import numpy as np
from numba import cuda, float32, int32, types

warnings.simplefilter("ignore")
checks = 0


def check(what, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        print(f"FAIL {what} {detail}")
        sys.exit(1)
    print(f"ok {what}")


def close(what, got, want):
    check(what, np.allclose(got, want), f"got {got!r}, want {want!r}")


dev = cuda.get_current_device()
check("one device", len(cuda.gpus) == 1 and dev.compute_capability >= (5, 0))
free, total = cuda.current_context().get_memory_info()
check("memory info reports the slice", total == int(sys.argv[1]), f"{total}")

n = 1000
h = np.arange(n, dtype=np.float32)


@cuda.jit
def axpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


d_x = cuda.to_device(h)
d_y = cuda.to_device(np.ones(n, dtype=np.float32))
d_out = cuda.device_array(n, dtype=np.float32)
axpy[(n + 127) // 128, 128](np.float32(2), d_x, d_y, d_out)
close("axpy with device arrays", d_out.copy_to_host(), 2 * h + 1)

# Shared memory and barriers: a block sum.
TPB = 128


@cuda.jit
def block_sum(x, out):
    s = cuda.shared.array(TPB, dtype=float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    s[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if t < step:
            s[t] += s[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


blocks = (n + TPB - 1) // TPB
partial = cuda.device_array(blocks, dtype=np.float32)
block_sum[blocks, TPB](d_x, partial)
close("shared memory block sums", partial.copy_to_host().sum(), h.sum())

# Atomics: a histogram.


@cuda.jit
def histogram(x, bins):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(bins, int(x[i]) % 16, 1)


bins = cuda.to_device(np.zeros(16, dtype=np.int32))
histogram[blocks, TPB](d_x, bins)
close("atomic histogram", bins.copy_to_host(), np.bincount(h.astype(np.int64) % 16, minlength=16))


@cuda.jit
def atomic_max(x, m):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.max(m, 0, x[i])


m = cuda.to_device(np.zeros(1, dtype=np.float32))
atomic_max[blocks, TPB](d_x, m)
close("atomic max", m.copy_to_host()[0], h.max())

# Device functions.


@cuda.jit(device=True)
def cube(v):
    return v * v * v


@cuda.jit
def cubes(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = cube(x[i])


small = cuda.to_device(np.arange(10, dtype=np.float64))
cubed = cuda.device_array(10, dtype=np.float64)
cubes[1, 32](small, cubed)
close("device function", cubed.copy_to_host(), np.arange(10.0) ** 3)

# Raw pointer arguments.


@cuda.jit(types.void(types.CPointer(types.float32), types.int32))
def scale_raw(p, count):
    i = cuda.grid(1)
    if i < count:
        p[i] = p[i] * 3


raw = cuda.to_device(h)
scale_raw[blocks, TPB](raw.device_ctypes_pointer.value, n)
close("raw pointer argument", raw.copy_to_host(), h * 3)

# Streams and events.
stream = cuda.stream()
start, end = cuda.event(), cuda.event()
hp = cuda.pinned_array(n, dtype=np.float32)
hp[:] = h
start.record(stream)
ds = cuda.to_device(hp, stream=stream)
d2 = cuda.device_array(n, dtype=np.float32, stream=stream)
axpy[blocks, TPB, stream](np.float32(1), ds, ds, d2)
res = cuda.pinned_array(n, dtype=np.float32)
d2.copy_to_host(res, stream=stream)
end.record(stream)
end.synchronize()
close("kernel and pinned copies on a stream", res, 2 * h)
check("event timing", cuda.event_elapsed_time(start, end) >= 0)

# A NumPy array registered for the duration (cuMemHostRegister), large enough for the shim to
# share its pages with vgpud over the unix socket; its data the same before, during and after.
big = np.arange(1 << 20, dtype=np.float32)
out = np.zeros_like(big)


def in_registered_memfd(addr):
    """Whether addr lies in a memfd the shim moved a registered range's pages into."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return "memfd:vgpu-registered" in line
    return False


with cuda.pinned(big, out):
    check("registering keeps the array's data", np.array_equal(big, np.arange(1 << 20, dtype=np.float32)))
    if os.environ.get("VGPU_TRANSPORT", "").startswith("unix:"):
        check("a registered array's pages are shared with vgpud",
              in_registered_memfd(big.ctypes.data + 8192) and in_registered_memfd(out.ctypes.data + 8192))
    db = cuda.to_device(big, stream=stream)
    db.copy_to_host(out, stream=stream)
    stream.synchronize()
close("copies from and to registered arrays", out, big)
out[:] = 7
check("a registered array takes writes after unregistering", float(out.sum()) == 7.0 * out.size)

# A register limit reaches the kernel.


@cuda.jit(max_registers=32)
def limited(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1


limited[blocks, TPB](d_x, d_out)
close("kernel with max_registers", d_out.copy_to_host(), h + 1)
regs = limited.get_regs_per_thread()
if isinstance(regs, dict):  # one entry per compiled signature
    regs = max(regs.values())
check("max_registers is honoured", 0 < regs <= 32, f"{regs} registers")

# Mapped (zero-copy) host memory: kernels read and write the guest's pages.
mapped = cuda.mapped_array(n, dtype=np.float32)
mapped[:] = h
axpy[blocks, TPB](np.float32(1), mapped, mapped, mapped)
cuda.synchronize()
close("kernel on mapped host memory", mapped, 2 * h)

# Managed memory: one array the host and kernels both use.
managed = cuda.managed_array(n, dtype=np.float32)
managed[:] = h
axpy[blocks, TPB](np.float32(2), managed, managed, managed)
cuda.synchronize()
close("kernel on managed memory", managed, 3 * h)

# Cooperative groups: grid.sync() makes numba link CUDA's libcudadevrt.a (its
# cudaCGSynchronize) and launch cooperatively. Each phase reads what the next block wrote in
# the previous one: without a grid-wide barrier between phases the values come out wrong.
@cuda.jit
def ring(data, out, phases):
    g = cuda.cg.this_grid()
    i = cuda.grid(1)
    n = data.size
    for _ in range(phases):
        v = data[(i + cuda.blockDim.x) % n]
        g.sync()
        data[i] = v + 1
        g.sync()
    out[i] = data[i]


RING_BLOCKS, RING_TPB, PHASES = 4, 32, 6
rn = RING_BLOCKS * RING_TPB
ring_data = cuda.to_device(np.arange(rn, dtype=np.int32))
ring_out = cuda.device_array(rn, dtype=np.int32)
ring[RING_BLOCKS, RING_TPB](ring_data, ring_out, PHASES)
want = (np.arange(rn) + PHASES * RING_TPB) % rn + PHASES
check("grid.sync() orders the phases of every block (libcudadevrt linked)",
      np.array_equal(ring_out.copy_to_host(), want))

print(f"PASS {checks} checks")
