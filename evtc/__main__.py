"""``python -m evtc`` is the ``evtc`` command."""

from evtc.cli import main

main()
