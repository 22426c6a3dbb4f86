"""Code generation: lowering the loop-nest IR to machine code (LLVM for CPUs)."""
