"""evtc's version, in a module of its own so that lower layers (the compiler's cache metadata,
the construct memo's keys) read it without importing the package's public names.

Input: nothing. Output: :data:`__version__`, re-exported as ``evtc.__version__``.
"""

__all__ = ["__version__"]

#: The package version (pyproject.toml's ``version``; tests/null/test_layers.py checks they agree).
__version__ = "0.1.0"
