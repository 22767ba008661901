"""Runtime: tensors from any framework, argument checking and packing, loading and launching
a built kernel.

Input: an Artifact and user tensors. Output: results on the GPU.
"""
