"""Kernel families: one epilogue, several kernels, one picked per problem.

Input: an epilogue Graph after passes, the operand dtypes and an arch. Output: the family's
:class:`~evtc.family.spec.KernelSpec` s, the choice of one for a problem, and the tuner's stored
choices (:mod:`evtc.family.spec`, :mod:`evtc.dispatch.tune`); the sm90 conv family, its choice and
the 1x1 rule (:mod:`evtc.family.conv`).
"""
