"""The plugin API: evtc epilogues inside other kernel generators.

Input: an epilogue (an ``@evtc.epilogue`` function, an expression, a Graph or IR text) and the
CTA tile, schedule and dtypes of another generator's CUTLASS 3.x sm90 GEMM. Output: an
:class:`EpilogueFragment`: the C++ declarations of the fusion callbacks type and of the
collective epilogue evtc planned for that tile, the ``Arguments`` initializer with named
placeholders, the headers, include directories and nvcc flags it needs, the plan's numbers and
the epilogue's run-time parameters. ``evtc emit --fragment`` writes one as a header.

The contract is versioned (:data:`FRAGMENT_VERSION`) and documented in docs/plugin.md; the
objects marked :func:`stable` are pinned by ``tests/golden/plugin_api.txt``. Two consumers
outside evtc use it: ``examples/hopper_gemm/`` (a hand-written CUTLASS GEMM) and
``examples/cutlass_library_gemm.py`` (CUTLASS's own ``cutlass_library`` instance emitter).

Example::

    import evtc, evtc.plugin

    frag = evtc.plugin.lower("D = relu(alpha*acc + beta*C + bias[n])", tile=(128, 256, 64),
                             a=evtc.bf16, d=evtc.bf16, name="BiasRelu", namespace="my_kernels")
    frag.check(tile=(128, 256, 64), schedule="cooperative")
    header = frag.header()               # #include it, then use my_kernels::BiasRelu
    init = frag.bind({p.name: f"args.{p.name}" for p in frag.placeholders})
"""

from evtc.errors import FragmentError
from evtc.plugin.fragment import FRAGMENT_VERSION, EpilogueFragment, Parameter, Placeholder
from evtc.plugin.lowering import lower
from evtc.plugin.stable import signatures, stable, stable_api

__all__ = ["FRAGMENT_VERSION", "EpilogueFragment", "FragmentError", "Parameter", "Placeholder", "lower",
           "signatures", "stable", "stable_api"]
