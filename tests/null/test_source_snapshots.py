"""Emitted sources are byte-identical to the pinned snapshot set (tests/snapshots.py): the
refactors above the emitter (issue 35) change no kernel. Rerun with --accept-golden only for a
change that is meant to change kernels, and say so in the commit."""

import snapshots


def test_emitted_sources_are_the_pinned_ones(golden):
    golden("source_snapshots.txt", snapshots.digest_lines())
