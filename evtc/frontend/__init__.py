"""Frontends: the Python tracer, the textual grammar and the torch.fx importer. Each one
produces an :class:`evtc.ir.Graph`."""
