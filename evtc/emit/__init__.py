"""Emitters: Graph + Plan -> CUDA C++ source (sm90 and sm80), and the C ABI description."""
