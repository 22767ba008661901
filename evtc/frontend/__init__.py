"""Frontends: the Python tracer (:mod:`~evtc.frontend.trace`), the textual forms
(:mod:`~evtc.frontend.text`) and the torch importer (:mod:`~evtc.frontend.torch_import`, epilogues
written with torch ops, read through torch.fx), each producing an :class:`evtc.ir.Graph` by
driving the one IR builder (:mod:`~evtc.frontend.builder`) that holds the semantics and the error
messages."""
