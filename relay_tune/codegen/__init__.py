"""Code generation: lowering the loop-nest IR to machine code (LLVM for CPUs, NVPTX for NVIDIA GPUs), and
loading compiled CPU kernels into this process (`jit`).
"""
