"""Frontends: the Python tracer and the textual grammar (a torch.fx importer is not built yet). Each one
produces an :class:`evtc.ir.Graph`."""
