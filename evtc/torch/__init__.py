"""evtc for PyTorch: Gemms as custom ops, a ``torch.compile`` backend, the call fast path.

Input: :class:`evtc.Gemm` objects, or the FX graphs Dynamo captures. Output: ``torch.library``
custom ops (:mod:`evtc.torch.ops`), the Dynamo backend ``"evtc"`` that fuses GEMMs with their
epilogues (:mod:`evtc.torch.backend`), and the C++ extension that runs repeated calls on torch
tensors without the Python argument path (:mod:`evtc.torch.fast`, NOTE [The torch fast path]).

Importing this package imports neither torch nor its modules; each module imports torch when it
needs it (``import torch`` in them is PyTorch itself: absolute imports only).
"""
