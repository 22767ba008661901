"""Cache archives: verified entries written into a tar file and read back on another machine.

Input: a cache and (for export) a selection of keys, or (for import) an archive. Output: an
archive of ``evtc cache export``'s format, or entries added to the cache after their checks
(:func:`evtc.compiler.store.check_meta` and the library's SHA-256), like Triton's and Inductor's
cache artifacts. ``evtc cache export`` / ``evtc cache import`` call these.

This module is the one import path of the two halves: :mod:`~evtc.compiler.archive_export`
(NOTE [Export targets]) and :mod:`~evtc.compiler.archive_import` (NOTE [Import limits]).
"""

from __future__ import annotations

from evtc.compiler.archive_export import EXPORT_FORMAT, MANIFEST, ExportSummary, export_entries
from evtc.compiler.archive_import import ImportLimits, ImportSummary, import_entries

__all__ = ["EXPORT_FORMAT", "ExportSummary", "ImportLimits", "ImportSummary", "MANIFEST", "export_entries",
           "import_entries"]
