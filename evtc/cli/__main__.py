"""``python -m evtc.cli`` is the ``evtc`` command too (as ``python -m evtc``)."""

from evtc.cli import main

main()
