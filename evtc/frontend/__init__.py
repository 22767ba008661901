"""Frontends: the Python tracer (:mod:`~evtc.frontend.trace`) and the textual forms
(:mod:`~evtc.frontend.text`), each producing an :class:`evtc.ir.Graph` by driving the one IR
builder (:mod:`~evtc.frontend.builder`) that holds the semantics and the error messages; a
torch.fx importer, not built yet, would drive the same builder (its API is documented there)."""
