"""PyTorch on vgpu, unmodified: the device and its slice as torch sees them, tensors copied to
and from the device (pageable and pinned, on side streams, timed with events), CUDA graphs of
copies, the caching allocator growing, shrinking and running out at the slice
(torch.cuda.OutOfMemoryError, after which the program goes on), a per-process memory fraction,
memory pools, an interprocess event, a CUDA tensor shared with a spawned process (CUDA IPC
within the VM), an NCCL process group of one rank, and the profiler (CPU activities: CUPTI
finds no profiling interface through vgpu). Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the allocator maps
its memory with the driver's virtual memory API instead (cuMemCreate, cuMemMap) and shares it
as file descriptors.

PyTorch's kernels are SASS only (no PTX in its wheels), so on the simulated GPU an operation that
launches one fails with "no kernel image is available", which the script checks is all that
happens; on a real GPU it runs and its result is checked.

Usage: torch_basics.py SLICE_BYTES. Prints one line per check and PASS at the end; exits 1 on
the first failure.
"""

import os
import sys
import warnings

import torch
import torch.multiprocessing as mp

warnings.simplefilter("ignore")
MIB = 1 << 20
checks = 0


def check(what, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        print(f"FAIL {what} {detail}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def child(q, r):
    """The spawned process: reads a shared CUDA tensor and answers what it holds."""
    t = q.get()
    r.put((float(t.cpu()[12345]), t.numel()))
    del t


def main():
    slice_bytes = int(sys.argv[1])
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    check("CUDA is available", torch.cuda.is_available())
    check("one device", torch.cuda.device_count() == 1)
    props = torch.cuda.get_device_properties(0)
    check("total memory is the slice", props.total_memory == slice_bytes, f"{props.total_memory}")
    free, total = torch.cuda.mem_get_info()
    check("mem_get_info reports the slice", total == slice_bytes and 0 < free <= total, f"{free} {total}")

    # Tensors to the device and back (4 MiB, pageable).
    a = torch.arange(MIB, dtype=torch.float32)
    d = a.to("cuda")
    check("a tensor round trip", torch.equal(d.cpu(), a))
    e = torch.empty_like(d)
    e.copy_(d)
    check("a device-to-device copy", torch.equal(e.cpu(), a))
    check("allocated bytes are counted", torch.cuda.memory_allocated() >= 2 * a.nbytes)

    # Pinned memory, non-blocking copies on a side stream, timed with events.
    p = torch.arange(1 << 16, dtype=torch.float64).pin_memory()
    out = torch.empty_like(p).pin_memory()
    s = torch.cuda.Stream()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        t0.record()
        dp = p.to("cuda", non_blocking=True)
        out.copy_(dp, non_blocking=True)
        t1.record()
    t1.synchronize()
    check("pinned copies on a side stream", p.is_pinned() and torch.equal(out, p))
    check("events time the stream", t0.elapsed_time(t1) >= 0 and s.query())

    # A CUDA graph of copies, captured on a side stream and replayed with new input.
    src = torch.arange(4096, dtype=torch.float32).cuda()
    dst = torch.empty_like(src)
    g = torch.cuda.CUDAGraph()
    cs = torch.cuda.Stream()
    cs.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cs):
        with torch.cuda.graph(g):
            dst.copy_(src)
    src.copy_(torch.full((4096,), 7.0))
    g.replay()
    torch.cuda.synchronize()
    check("a CUDA graph replays its copy", torch.equal(dst.cpu(), torch.full((4096,), 7.0)))
    del g

    # The caching allocator grows to half the slice and gives it back.
    torch.cuda.empty_cache()
    base_free = torch.cuda.mem_get_info()[0]
    chunk = slice_bytes // 16
    held = [torch.empty(chunk, dtype=torch.uint8, device="cuda") for _ in range(8)]
    free = torch.cuda.mem_get_info()[0]
    check("half the slice allocated", free <= slice_bytes - 8 * chunk, f"{free}")
    del held
    torch.cuda.empty_cache()
    check("empty_cache returns it", torch.cuda.mem_get_info()[0] >= base_free - 4 * MIB)

    # Out of memory at the slice: torch's own error, naming the slice's capacity; then go on.
    try:
        torch.empty(2 * slice_bytes, dtype=torch.uint8, device="cuda")
        check("twice the slice is refused", False, "allocated")
    except torch.cuda.OutOfMemoryError as err:
        cap = f"total capacity of {slice_bytes / MIB:.2f} MiB"
        check("twice the slice is refused", cap in str(err), str(err)[:300])
    pieces = []
    try:
        for _ in range(32):
            pieces.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        check("the slice runs out in pieces", False, f"{len(pieces)} pieces")
    except torch.cuda.OutOfMemoryError:
        check("the slice runs out in pieces", 8 <= len(pieces) < 16, f"{len(pieces)} pieces")
    del pieces
    torch.cuda.empty_cache()
    check("a tensor round trip after running out", torch.equal(a.cuda().cpu(), a))

    # A per-process memory fraction caps the allocator below the slice.
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        torch.empty(slice_bytes // 2, dtype=torch.uint8, device="cuda")
        check("a memory fraction caps the allocator", False, "allocated")
    except torch.cuda.OutOfMemoryError:
        check("a memory fraction caps the allocator", True)
    torch.cuda.set_per_process_memory_fraction(1.0)

    # A memory pool of its own.
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        pt = torch.arange(1000, dtype=torch.int64).cuda()
    check("a MemPool holds its tensor", len(pool.snapshot()) == 1 and int(pt.cpu()[999]) == 999)
    del pt

    # Interprocess events and a tensor shared with a spawned process.
    ev = torch.cuda.Event(interprocess=True)
    ev.record()
    check("an interprocess event has a handle", len(ev.ipc_handle()) == 64)
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(q, r))
    proc.start()
    shared = torch.arange(1 << 16, dtype=torch.float32).cuda()
    q.put(shared)
    got = r.get(timeout=300)
    proc.join(60)
    check("a spawned process reads a shared tensor", got == (12345.0, 1 << 16) and proc.exitcode == 0, f"{got} {proc.exitcode}")

    # NCCL, one rank (as torchrun with one process per GPU starts it): its topology detection
    # reads sysfs at the GPU's PCI location and took the machine's host bridge there for it.
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "nccl", init_method=f"file://{tmp}/store", rank=0, world_size=1, device_id=torch.device("cuda:0")
        )
        t = torch.arange(4, dtype=torch.float32).cuda()
        dist.all_reduce(t)
        dist.barrier()
        check("an NCCL process group of one rank reduces", t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0])
        dist.destroy_process_group()

    # The profiler with CUDA activities: CUPTI finds no profiling interface through vgpu and
    # PyTorch records the CPU side (CUPTI recursed until the stack ran out, killing the process).
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        a.cuda().cpu()
    ops = {e.key for e in prof.key_averages()}
    check("the profiler records the copies", "aten::copy_" in ops, f"{sorted(ops)}")

    # A kernel: PyTorch's are SASS only, which the simulated GPU cannot run.
    try:
        total_ones = torch.ones(1000, device="cuda").sum().item()
        check("a kernel runs on a real GPU", total_ones == 1000.0, f"{total_ones}")
    except (torch.AcceleratorError, RuntimeError) as err:
        check("a kernel without a usable image fails cleanly", "no kernel image" in str(err), str(err)[:300])
        check("copies go on after it", torch.equal(a.cuda().cpu(), a))

    # cuBLAS 13 starts: its cubins are zstd-compressed (CUDA 13's libraries all are), and its
    # handle reads a variable of one (it failed with CUBLAS_STATUS_ALLOC_FAILED before vgpu read
    # zstd). A matrix product runs on a real GPU and fails cleanly on the simulated one.
    check("a cuBLAS handle", torch.cuda.current_blas_handle() != 0)
    # cuBLAS's kernels for small products and dot products carry PTX for compute 12.0, which
    # the simulated GPU runs too (before 2026-12-06 they failed on any device: the driver's
    # tools tables, which cuBLAS asks for the thread's context and the context's number, were
    # refused).
    small = torch.full((8, 8), 0.5)
    check("a small matrix product", torch.equal((small.cuda() @ small.cuda()).cpu(), small @ small))
    ones = torch.ones(64)
    check("a dot product", torch.dot(ones.cuda(), ones.cuda()).item() == 64.0)
    m = torch.full((64, 64), 0.5)
    try:
        prod = (m.cuda() @ m.cuda()).cpu()
        check("a matrix product on a real GPU", torch.allclose(prod, m @ m), f"{prod[0, 0]}")
    except (torch.AcceleratorError, RuntimeError) as err:
        check("a matrix product fails cleanly without SASS", "CUBLAS" in str(err) or "kernel image" in str(err), str(err)[:300])
        check("copies go on after the product", torch.equal(a.cuda().cpu(), a))

    torch.cuda.synchronize()
    print(f"{checks} checks, expandable segments {'on' if expandable else 'off'}")
    print("PASS")


if __name__ == "__main__":
    main()
