"""The autotuner: time a family's best-ranked kernels on the GPU and remember the fastest per shape
bucket.

Input: a Gemm's :class:`~evtc.dispatch.dispatcher.Dispatcher` and problem shapes. Output: per
(epilogue, dtypes, arch, device, shape bucket), the candidate (member, cluster and run-time
arguments) that ran fastest, stored as JSON under the kernel cache directory
(``<cache>/tuning/<key>.json``) so that later processes reuse them;
:meth:`evtc.dispatch.family.GemmFamily.choose` consults the store before its model.

Candidates are the ``top`` the selection model ranks highest (NOTE [The selection model] in
:mod:`evtc.dispatch.select`; on the validation half of the corpus the fastest candidate was among
the model's first 4 within 2 % on 95-97 % of problems, docs/performance.md), or every candidate of
:func:`evtc.dispatch.space.candidates` with ``top=None``. Each is timed with
CUDA events on fresh random inputs, several sets rotated so that they don't all sit in L2, after a
warm-up, median of many runs, inside CUDA graphs (:func:`evtc.runtime.timing.time_graphs`: the
kernels' own time, which a back-to-back sample of a small problem hides behind the host's launch path); a candidate whose first call
takes more than ``limit_s`` on the GPU is dropped (it is never waited for forever: the tuner polls
an event). The result is deterministic given the store: the same shapes pick the same kernels.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable

from evtc.family.spec import KernelSpec, Problem

__all__ = ["TuneStore", "candidates", "shape_bucket", "tune"]

STORE_FORMAT = 2  # 2: records name the candidate's whole configuration (1: a member and split-K)


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def shape_bucket(M: int, N: int, K: int, L: int = 1) -> str:
    """Problems whose M, N and K round up to the same powers of two share a tuned choice (and
    batched problems are tuned apart from unbatched ones)."""
    return f"{_pow2(M)}x{_pow2(N)}x{_pow2(K)}{'xL' if L > 1 else ''}"


class TuneStore:
    """The stored choices of one epilogue (one JSON file, updated under a file lock).

    Args:
        path: the JSON file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict | None = None

    @classmethod
    def for_family(cls, family) -> "TuneStore":
        """The store of a :class:`~evtc.dispatch.family.GemmFamily`: keyed by its epilogue's IR
        after passes, dtypes, arch and members."""
        from evtc.compiler.store import cache_root

        material = json.dumps([STORE_FORMAT, str(family.graph), family.a.name, family.b.name, family.arch,
                               sorted((n, s.config.kernel_json(s.arch)) for n, s in family.members.items())])
        key = hashlib.sha256(material.encode()).hexdigest()[:32]
        return cls(cache_root(create=False).path / "tuning" / f"{key}.json")

    def _read(self) -> dict:
        """The store's JSON, or an empty store where the file is missing, unreadable, nested too
        deeply for Python's reader, or not a store of this format (an older one, a damaged or a
        foreign file: its choices are not read, and the next :meth:`put` replaces it)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            data = None
        if not (isinstance(data, dict) and data.get("format") == STORE_FORMAT and isinstance(data.get("choices"), dict)):
            data = {"format": STORE_FORMAT, "choices": {}}
        return data

    def _load(self) -> dict:
        if self._data is None:
            self._data = self._read()
        return self._data

    def get(self, bucket: str, device: str) -> dict | None:
        """The stored record for ``bucket`` on ``device``, or None."""
        per_device = self._load()["choices"].get(device)
        rec = per_device.get(bucket) if isinstance(per_device, dict) else None
        return rec if isinstance(rec, dict) and "member" in rec else None

    def put(self, bucket: str, device: str, record: dict) -> None:
        """Store ``record`` (``member``, ``runtime``, the timings) for ``bucket`` on ``device``."""
        from filelock import FileLock  # here, not at import: a call's first choice only reads (about 90 ms)

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with FileLock(str(self.path) + ".lock", timeout=60):
            data = self._read()
            per_device = data["choices"].get(device)
            if not isinstance(per_device, dict):
                per_device = data["choices"][device] = {}
            per_device[bucket] = record
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
            self._data = data


def candidates(family, p: Problem, top: int | None = 4, device: str | None = None) -> list[KernelSpec]:
    """The candidates worth timing for ``p``: the first ``top`` (all with None) of a
    :class:`~evtc.dispatch.family.GemmFamily`'s candidate space as ``device``'s model ranks it."""
    from evtc.dispatch import space

    ranked = family.ranked(p, device)
    if not ranked:  # no table: the whole space, in its own order
        members = tuple(family.members.values())
        ranked = space.candidates(p, family.traits, family.graph, family.a, family.b,
                                  members=members + space.cluster_variants(members))
    return ranked if top is None else ranked[:top]


def space_label(spec: KernelSpec) -> str:
    from evtc.dispatch.space import label

    return label(spec)


def record_of(spec: KernelSpec) -> dict:
    """What the store keeps of a winner: its label, configuration and arch."""
    from evtc.dispatch.space import label

    return {"label": label(spec), "member": spec.name, "config": spec.config.to_json(), "arch": spec.arch}


def spec_of(rec: dict) -> KernelSpec | None:
    """The KernelSpec of a stored record, or None for a record this evtc can't read (an older
    format, a configuration that no longer validates)."""
    from evtc.errors import ConfigError
    from evtc.plan.config import GemmConfig

    try:
        return KernelSpec(str(rec["member"]), GemmConfig.from_json(dict(rec["config"])), str(rec["arch"]))
    except (KeyError, TypeError, ValueError, ConfigError):
        return None


def _wait(event: Any, limit_s: float) -> bool:
    """Poll ``event`` until it completes or ``limit_s`` passes; True if it completed."""
    t0 = time.perf_counter()
    while not event.query():
        if time.perf_counter() - t0 > limit_s:
            return False
        time.sleep(0.001)
    return True


def _build(fam, cands: list[KernelSpec]) -> None:
    """Build (or fetch from the cache) the candidates' kernels in parallel; a failed build leaves
    its kernel unloaded (the candidate is then not timed)."""
    from evtc.compiler import cache
    from evtc.dispatch.family import kernel_key

    unbuilt = list({kernel_key(c): fam.kernel(c) for c in cands if fam.kernel(c).library is None}.values())
    if unbuilt:
        for k, art in zip(unbuilt, cache.build_many([k.job() for k in unbuilt])):
            if not isinstance(art, Exception):
                k.load(art)


def _runnable(fam, cands: list[KernelSpec], sets: list[dict], limit_s: float, verbose: bool) -> dict:
    """label -> (call, spec) of each candidate that runs the problem within ``limit_s``: its calls
    rotate over the input ``sets``, so that A and B are not all L2 hits."""
    import torch

    out = {}
    for c in cands:
        label = space_label(c)
        if fam.kernel(c).library is None:
            continue
        launcher = fam.launcher(c)
        state = {"i": 0}

        def call(launcher=launcher, state=state):
            kw = sets[state["i"] % len(sets)]
            state["i"] += 1
            launcher(kw["A"], kw["B"], {k: v for k, v in kw.items() if k not in ("A", "B")})

        try:
            call()
            ev = torch.cuda.Event()
            ev.record()
            if not _wait(ev, limit_s):
                continue
        except Exception as e:  # noqa: BLE001 - a candidate that can't run this problem
            if verbose:
                print(f"  {label}: {type(e).__name__}: {e}")
            continue
        out[label] = (call, c)
    return out


def _times(calls: dict, iters: int) -> dict[str, float]:
    """Median ms of each call: the kernels' own time, in CUDA graphs (a back-to-back sample of a
    small problem times the host's launch path instead); what can't be captured, back to back."""
    from evtc.runtime.timing import time_graphs, time_interleaved

    times = time_graphs(calls, iters=iters)
    rest = {k: f for k, f in calls.items() if not times[k] == times[k]}
    if rest:
        times.update(time_interleaved(rest, iters=iters))
    return times


def tune(dispatch, shapes: Iterable[tuple[int, ...]], *, iters: int = 30, limit_s: float = 2.0, seed: int = 0,
         store: bool = True, verbose: bool = False, top: int | None = 4) -> list[dict]:
    """Time the candidates of every shape and store the fastest (see the module docstring).

    Args:
        dispatch: a family Gemm's Dispatcher (a pinned one has nothing to choose).
        shapes: (M, N, K) or (M, N, K, L) problems.
        iters: timed samples per candidate.
        limit_s: a candidate whose first call runs longer on the GPU is dropped, in seconds.
        seed: seed of the random inputs.
        store: write the winners to the store.
        top: time the model's first ``top`` candidates (None: all of them).

    Returns:
        One dict per shape: ``shape``, ``bucket``, ``device``, ``times_ms`` (candidate label ->
        median ms), the winner's ``label``, ``member``, ``config`` and ``arch``, and ``heuristic``
        (the model's first choice, and its time).

    Raises:
        NoDeviceError: no CUDA GPU (through torch).
    """
    import torch

    from evtc.errors import NoDeviceError
    from evtc.runtime.timing import random_inputs

    if not torch.cuda.is_available():
        raise NoDeviceError("tuning needs a CUDA GPU", hint="run gemm.tune on the machine the kernels will run on")
    device = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fam = dispatch.family
    db = TuneStore.for_family(fam)
    results = []
    for shape in shapes:
        M, N, K, L = (tuple(shape) + (1,))[:4]
        p = Problem(M, N, K, L, sm_count=sms)
        cands = candidates(fam, p, top, device)
        _build(fam, cands)
        sets = [random_inputs(fam.graph, fam.a, fam.b, p, seed=seed + i) for i in range(3)]
        runnable = _runnable(fam, cands, sets, limit_s, verbose)
        if not runnable:
            continue
        times = _times({k: call for k, (call, _) in runnable.items()}, iters)
        best = min(times, key=times.get)
        first = space_label(cands[0])
        rec = {**record_of(runnable[best][1]), "ms": times[best], "times_ms": times,
               "tuned_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        if store:
            db.put(shape_bucket(M, N, K, L), device, rec)
        results.append({"shape": [M, N, K, L], "bucket": shape_bucket(M, N, K, L), "device": device, **rec,
                        "heuristic": {"label": first, "ms": times.get(first)}})
        if verbose:
            print(f"{M}x{N}x{K}x{L}: {best} {times[best]:.4f} ms (the model's first: {first})")
    fam.forget_tuning()  # re-read the store
    if store:
        dispatch.forget()  # calls already dispatched take the new choices too
    return results
