#!/usr/bin/env python3
"""Compile bench/kernels/spin.cu to spin.ptx with NVRTC (compute_80).

Uses the same NVRTC loader as tests/kernels/gen-ptx.py (pinned NVIDIA wheels).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "kernels"))
gen = __import__("gen-ptx")


def main():
    lib = gen.load_nvrtc()
    inc = gen.include_dir()
    with open(os.path.join(HERE, "spin.cu"), "rb") as f:
        src = f.read()
    ptx = gen.compile_ptx(lib, inc, "spin.cu", src, "80")
    with open(os.path.join(HERE, "spin.ptx"), "w", newline="\n") as f:
        f.write(ptx)
    print("wrote bench/kernels/spin.ptx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
