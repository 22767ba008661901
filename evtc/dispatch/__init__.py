"""The call path's dispatch stage: a problem -> the kernel that runs it.

Input: a :class:`~evtc.family.spec.Problem` (M, N, K, L, alignment, device) and the epilogue's
traits. Output: a :class:`~evtc.family.spec.KernelSpec` (a family member with its run-time
arguments). :mod:`evtc.dispatch.space` enumerates the candidates a problem may run on.
"""
