"""cuda.core (NVIDIA's Pythonic CUDA API, a dependency of numba-cuda) on vgpu: a program compiled
with NVRTC, launched on streams, and graphs built with cuda.core's GraphBuilder: a straight line,
a fork and join, and conditional nodes (if/else, while, switch) whose bodies run as the graph's
own kernels set the condition with cudaGraphSetConditional; and a kernel on page-locked memory
from LegacyPinnedMemoryResource at its host address. Prints PASS when every check holds.
"""
import ctypes
import sys

import numpy as np
from cuda.bindings import driver
from cuda.core import (
    Device,
    LaunchConfig,
    LegacyPinnedMemoryResource,
    Program,
    ProgramOptions,
    launch,
)
from cuda.core.graph import GraphBuilder

CODE = r"""
extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
extern "C" __global__ void add_one(int *a) { *a += 1; }
extern "C" __global__ void set_condition(cudaGraphConditionalHandle h, int v) {
    cudaGraphSetConditional(h, v);
}
extern "C" __global__ void count_down(int *left, cudaGraphConditionalHandle h) {
    int now = --*left;
    cudaGraphSetConditional(h, now > 0);
}
"""
CELLS = 4
ONE = LaunchConfig(grid=1, block=1)


def check(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got}, want {want}")
        sys.exit(1)
    print(f"ok {what}")


def main():
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    options = ProgramOptions(arch=f"compute_{dev.arch}", std="c++17")
    mod = Program(CODE, code_type="c++", options=options).compile("ptx")
    add_one, set_condition, count_down = (
        mod.get_kernel(n) for n in ("add_one", "set_condition", "count_down")
    )
    buf = dev.allocate(4 * CELLS, stream=stream)
    base = int(buf.handle)
    host = np.zeros(CELLS, dtype=np.int32)

    def cell(i):
        return np.uint64(base + 4 * i)

    def put(values):
        host[:] = values
        stream.sync()
        (err,) = driver.cuMemcpyHtoD(base, host.ctypes.data, host.nbytes)
        check("cuMemcpyHtoD", err, driver.CUresult.CUDA_SUCCESS)

    def get():
        stream.sync()
        (err,) = driver.cuMemcpyDtoH(host.ctypes.data, base, host.nbytes)
        check("cuMemcpyDtoH", err, driver.CUresult.CUDA_SUCCESS)
        return host.tolist()

    # A straight line, then a fork and a join.
    put([0] * CELLS)
    gb = dev.create_graph_builder().begin_building()
    launch(gb, ONE, add_one, cell(0))
    left, right = gb.split(2)
    launch(left, ONE, add_one, cell(1))
    launch(right, ONE, add_one, cell(2))
    gb = GraphBuilder.join(left, right)
    launch(gb, ONE, add_one, cell(0))
    graph = gb.end_building().complete()
    graph.upload(stream)
    graph.launch(stream)
    graph.launch(stream)
    check("a forked and joined graph, launched twice", get()[:3], [4, 2, 2])

    # if/else on a condition a kernel of the graph sets.
    for value, want in ((1, [2, 0, 1]), (0, [0, 1, 1])):
        put([0] * CELLS)
        gb = dev.create_graph_builder().begin_building()
        cond = gb.create_condition()
        launch(gb, ONE, set_condition, cond, np.int32(value))
        then, other = gb.if_else(cond)
        then.begin_building()
        launch(then, ONE, add_one, cell(0))
        launch(then, ONE, add_one, cell(0))
        then.end_building()
        other.begin_building()
        launch(other, ONE, add_one, cell(1))
        other.end_building()
        launch(gb, ONE, add_one, cell(2))
        gb.end_building().complete().launch(stream)
        check(f"if/else with the condition {value}", get()[:3], want)

    # while: each launch starts from the default (true).
    put([0, 0, 0, 5])
    gb = dev.create_graph_builder().begin_building()
    cond = gb.create_condition(default_value=1)
    body = gb.while_loop(cond)
    body.begin_building()
    launch(body, ONE, add_one, cell(0))
    launch(body, ONE, count_down, cell(3), cond)
    body.end_building()
    graph = gb.end_building().complete()
    graph.launch(stream)
    check("a while loop of 5 iterations", get(), [5, 0, 0, 0])
    put([5, 0, 0, 3])
    graph.launch(stream)
    check("the same graph again, 3 iterations", get(), [8, 0, 0, 0])

    # switch: case n adds one to cell n; past the last case nothing runs.
    for value in range(4):
        put([0] * CELLS)
        gb = dev.create_graph_builder().begin_building()
        cond = gb.create_condition()
        launch(gb, ONE, set_condition, cond, np.int32(value))
        for i, case in enumerate(gb.switch(cond, 3)):
            case.begin_building()
            launch(case, ONE, add_one, cell(i))
            case.end_building()
        gb.end_building().complete().launch(stream)
        want = [int(i == value) for i in range(3)]
        check(f"switch on {value}", get()[:3], want)

    # Page-locked host memory from LegacyPinnedMemoryResource, handed to a kernel directly (CUDA
    # lets kernels use any page-locked buffer at its host address).
    pinned = LegacyPinnedMemoryResource().allocate(4 * CELLS)
    view = np.frombuffer((ctypes.c_int32 * CELLS).from_address(int(pinned.handle)), dtype=np.int32)
    view[:] = [41, 0, 0, 0]
    launch(stream, ONE, add_one, np.uint64(int(pinned.handle)))
    stream.sync()
    check("a kernel on LegacyPinnedMemoryResource memory", view.tolist(), [42, 0, 0, 0])
    pinned.close()

    buf.close(stream)
    stream.sync()
    print("PASS")


if __name__ == "__main__":
    main()
