"""The construct memo: what ``evtc.Gemm(...)`` computed for an epilogue, kept on disk so that a
later process constructing the same Gemm skips the passes (and sympy), the planner and the
emitter.

Input: a traced Graph and everything its results depend on (arch, operand dtypes, the kernel's
configuration and planner options). Output: the post-pass Graph of an arch, and per kernel its
Plan (with the swap-AB graph it plans) and its emitted source; or None, and the caller computes
the value and stores it.

# NOTE [The construct memo]

A cache hit (construct a Gemm and make its first call in a fresh process) took 0.5 s here and
3-4 s on the GPU machine, nearly all of it importing sympy, networkx and jinja2 and running the
passes, planner and templates again for a kernel whose build the cache already holds. The memo
keeps their results in the kernel cache directory (``EVTC_CACHE_DIR``)::

    <root>/construct/<key[:2]>/<key>.graph     the post-pass Graph of one arch (pickle)
    <root>/construct/<key[:2]>/<key>.plan      one kernel's Plan and, under swap-AB, its graph (pickle;
                                               the Plan's visitor tree as a nested pickle, read
                                               when first used: a hit that emits nothing never
                                               imports the lowering)
    <root>/construct/<key[:2]>/<key>.source    one kernel's emitted .cu (UTF-8)
    <root>/construct/<key[:2]>/<key>.trace     the traced Graph of a textual epilogue (pickle)

Keys. Every key is the SHA-256 of: :data:`SCHEMA`; evtc's version; Python's version and ``-O``;
the content hash of evtc's own Python sources, templates and grammar
(:func:`evtc.compiler.fingerprint.sources_hash`); where numpy, sympy, networkx, jinja2, lark and
mpmath are installed and the size, mtime and inode of their ``__init__.py`` (:func:`deps_text`: an
upgrade changes the key); the verification setting; the op table (:func:`ops_text`: an op
registered or replaced at run time with code from outside evtc turns the memo off); and a
canonical dump of the traced graph: every node's kind and fields (``repr`` of floats, dtypes,
attributes), its inputs by position and its source location, the graph's name, inputs, outputs
and ``def`` line (:func:`graph_text`). A ``.graph`` key adds the arch; ``.plan`` and ``.source``
keys add the kernel's arch, operand dtypes, full configuration (run-time fields too), policy,
plan rank and fixed decisions. A ``.trace`` key (:func:`traced_text`: a textual epilogue, which
the tracer would parse with lark) has the text and the ``c`` and ``d`` dtypes instead of a
traced graph. Editing evtc, the epilogue or any option gives another key; stale entries are never
read again (``evtc cache prune --all`` removes them, ``--older-than`` those unused for a while).

Trust. An entry is read only from a private cache (not ``EVTC_SHARED_CACHE``) and only if it and
its folders pass NOTE [Trusted files] (evtc/compiler/trust.py: no links below the cache
directory, owned by the user or root, writable by nobody else), read through one checked
descriptor. Its first line is a JSON header (schema, kind, key, payload size, payload SHA-256) that
must match what the reader expects; the payload must hash to the header's SHA-256; a pickle is
read by an unpickler that only builds the dataclasses and enums of evtc's IR, lowering and plan
modules (and a few builtin containers); and the object read must have the expected type.
Anything else (a truncated, edited, foreign or older entry, a pickle that names another class)
is ignored, reported at debug level on the ``evtc.memo`` logger, and recomputed (and
rewritten). Nothing here raises.

Writes go to a private temporary file in the entry's folder, renamed into place
(``os.replace``), so a reader sees a whole entry or none; concurrent writers of one key write the
same content and the last rename wins. No lock is needed. Errors are never stored: an epilogue
that fails the passes or the planner fails again, the same way, on the next construct.

Identity. What a memo hit gives is what the computation gives: the same IR text, plans, sources
byte for byte and so the same kernel cache keys (tests/cache/test_construct_memo.py). Only
results are skipped, not errors or checks that run on every construct (dtype and configuration
checks, tracing). ``EVTC_CONSTRUCT_MEMO=0`` turns the memo off; it is also off while the cache
directory does not exist (a process that never built or looked up a kernel writes none) or is not
private; a construct never creates, tightens or warns about the cache directory.
"""

from __future__ import annotations

import dataclasses

import enum
import hashlib
import importlib
import io
import json
import logging
import os
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

from evtc import knobs
from evtc.errors import EvtcError

__all__ = ["DEPENDENCIES", "ENV", "SCHEMA", "Memo", "deps_text", "enabled", "graph_text", "memo_for", "ops_text",
           "traced_text"]

#: Version of the entry format and of what the pickles hold (bump to ignore every old entry).
SCHEMA = 2
#: The environment variable that turns the memo off (``0``) or on (``1``, the default).
ENV = "EVTC_CONSTRUCT_MEMO"
#: The largest entry read, in bytes (a bigger file is not an entry of ours).
MAX_ENTRY_BYTES = 64 << 20

log = logging.getLogger("evtc.memo")

#: the values evtc.passes.manager reads as on or off
_ON_OFF = frozenset({"1", "true", "yes", "on", "0", "false", "no", "off", ""})

def enabled() -> bool:
    """Whether ``EVTC_CONSTRUCT_MEMO`` leaves the memo on (unset, ``1``, ``true``, ``on``)."""
    try:
        return knobs.construct_memo.get()
    except EvtcError:  # a value the one truthiness rule refuses turns the memo off (it never raises)
        return False


def _root():
    """The private cache directory if it exists, is the user's (or root's) and nobody else can
    write it, and the memo is on; else None. Read-only: unlike
    :func:`evtc.compiler.store.cache_root`, it never creates, tightens or warns (a construct
    shows nothing of the cache; the first build or lookup does)."""
    if not enabled():
        return None
    from evtc.compiler import trust
    from evtc.compiler.store import CacheRoot, _configured

    try:
        path, shared = _configured()
        st = os.stat(path)  # the trust root may be a link (NOTE [Trusted files])
    except Exception as e:  # no cache directory (yet), no HOME: the memo stays off
        log.debug("construct memo off: %s", e)
        return None
    if shared:
        log.debug("construct memo off: %s is a shared cache", path)
        return None
    try:
        trust.check_stat(st, path, want_dir=True)
    except trust.Untrusted as e:
        log.debug("construct memo off: %s", e)
        return None
    return CacheRoot(path, False)


def _evtc_sources(root) -> str:
    """The content hash of evtc's Python sources, templates and grammar (64 hex digits)."""
    from evtc.compiler import fingerprint
    from evtc.resources import data_path

    pkg = Path(__file__).resolve().parent.parent
    roots: dict[str, tuple[Path, tuple[str, ...] | None]] = {"evtc": (pkg, (".py",))}
    for name in ("codegen_templates", "grammar"):
        try:
            roots[name] = (data_path(name), None)
        except FileNotFoundError:
            pass
    headers = root.sub("headers")
    return fingerprint.sources_hash(roots, headers if headers.is_dir() else None)


# --------------------------------------------------------------------------------------------
# The traced graph's canonical dump (the key)
# --------------------------------------------------------------------------------------------

def _all_nodes(graph) -> list:
    """Every node of ``graph``: the reachable ones in topological order, then declared inputs
    no output uses."""
    nodes = list(graph.nodes)
    seen = {id(n) for n in nodes}
    nodes += [i for i in graph.inputs if id(i) not in seen]
    return nodes


def graph_text(graph) -> str:
    """A canonical dump of everything a Graph holds, source locations included: the memo's key
    material for a traced graph.

    One line per node (its position, kind, every field as ``repr`` with nodes by position), then
    the graph's name, ``def`` line, inputs and outputs by position. Two graphs with the same dump
    give the same passes, plans and sources.
    """
    from evtc.ir.nodes import Node

    nodes = _all_nodes(graph)
    index = {id(n): k for k, n in enumerate(nodes)}

    def field(v: Any) -> str:
        if isinstance(v, Node):
            return f"%{index[id(v)]}"
        if isinstance(v, tuple):
            return "(" + ", ".join(field(x) for x in v) + ",)"
        return repr(v)

    lines = [f"graph {graph.name!r} loc={graph.loc!r}"]
    for k, n in enumerate(nodes):
        parts = [f"{f.name}={field(getattr(n, f.name))}" for f in dataclasses.fields(n)]
        lines.append(f"{k} {type(n).__module__}.{type(n).__qualname__} " + " ".join(parts))
    lines.append("inputs " + " ".join(f"%{index[id(i)]}" for i in graph.inputs))
    lines.append("outputs " + " ".join(f"%{index[id(o)]}" for o in graph.outputs))
    return "\n".join(lines)


def ops_text() -> str | None:
    """The op table (:data:`evtc.ops.OPS`) as key material: every op's name, arity, functor,
    commutativity and the names of its reference, torch and sympy functions; None when an op's
    function comes from outside evtc and numpy (an op registered or replaced at run time, whose
    code the key can't see: no memo then)."""
    from evtc import ops

    rows = []
    for name in sorted(ops.OPS):
        op = ops.OPS[name]
        fns = []
        for fn in (op.numpy, op.torch, op.sympy):
            if fn is None:
                fns.append(None)
                continue
            module = getattr(fn, "__module__", None) or ""
            if module != "numpy" and not module.startswith(("evtc.", "numpy.")):
                return None
            fns.append(f"{module}.{getattr(fn, '__qualname__', type(fn).__name__)}")
        rows.append([name, op.arity, op.functor, op.commutative, fns])
    return json.dumps(rows)


#: the libraries whose versions can change what the passes, planner and emitter compute (sympy's
#: canonical forms, numpy's constant folding, networkx's orders, jinja2's rendering, lark's trees)
DEPENDENCIES = ("numpy", "sympy", "networkx", "jinja2", "lark", "mpmath")


def deps_text() -> str:
    """Where each of :data:`DEPENDENCIES` is installed and its ``__init__.py``'s size, mtime and
    inode, found without importing it (about 0.3 ms; an upgrade rewrites the file, so the key
    changes)."""
    import importlib.util

    rows = []
    for name in DEPENDENCIES:
        mod = sys.modules.get(name)
        try:
            origin = getattr(mod, "__file__", None) if mod is not None else None
            if origin is None:
                spec = importlib.util.find_spec(name)
                origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin else None
        except (ImportError, ValueError, OSError):
            origin, st = None, None
        rows.append(f"{name}:{origin}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}" if st is not None else f"{name}:none")
    return "\n".join(rows)


def _common(root) -> list[str]:
    """The key material every entry shares: schema, evtc's version and sources, Python's version
    and ``-O``, the dependencies (see NOTE [The construct memo]).

    Raises:
        OSError: evtc's sources can't be read.
    """
    from evtc._version import __version__

    return [f"evtc-construct-memo {SCHEMA}", __version__, f"{sys.version.split()[0]} -O{sys.flags.optimize}",
            _evtc_sources(root), deps_text()]


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Pickles: base-graph nodes by reference, only evtc's classes on the way back
# --------------------------------------------------------------------------------------------

_BUILTINS = frozenset({"tuple", "list", "dict", "set", "frozenset", "complex"})
#: where the classes of graphs, plans and trees live: only their dataclasses and enums are built
_MODULES = frozenset({"evtc.dtypes", "evtc.errors"})
_PACKAGES = ("evtc.ir.", "evtc.lower.", "evtc.plan.")


def _rebuilders() -> tuple:
    """The functions evtc's ``__reduce__`` methods name (besides classes)."""
    from evtc.dtypes import by_name
    from evtc.ir.nodes import _rebuild

    return (_rebuild, by_name)


class _Unpickler(pickle.Unpickler):
    """Builds only the dataclasses and enums of evtc's IR, lowering and planning modules (and
    ``SourceLoc``), the two functions that rebuild nodes and dtypes, and a few builtin
    containers; resolves references to the nodes of a graph the reader holds."""

    def __init__(self, data: bytes, base: list | None) -> None:
        super().__init__(io.BytesIO(data))
        self._base = base

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module == "copyreg" and name in ("_reconstructor", "__newobj__", "__newobj_ex__"):
            return super().find_class(module, name)
        if (module in _MODULES or module.startswith(_PACKAGES)) and name.isidentifier():
            mod = sys.modules.get(module)
            if mod is None:
                mod = importlib.import_module(module)  # the planner's or the tree's, not imported yet
            obj = getattr(mod, name, None)
            data = isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
            if data or any(obj is f for f in _rebuilders()):
                return obj
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if self._base is None or not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "n"
                                      and isinstance(pid[1], int) and 0 <= pid[1] < len(self._base)):
            raise pickle.UnpicklingError(f"bad reference {pid!r}")
        return self._base[pid[1]]


def _tree_nodes(base: list, kernel_graph) -> list:
    """What a Plan's visitor tree refers to by reference: the base graph's nodes and the kernel
    graph's (itself under swap-AB: its transpose's nodes; else the base's again), in one order on
    both sides."""
    return base + _all_nodes(kernel_graph) + [kernel_graph]


def _real_tree(tree: Any) -> Any:
    return tree.load() if isinstance(tree, _LazyTree) else tree


class _LazyTree:
    """A Plan's visitor tree read from the memo when first used (NOTE [The construct memo]): a
    cache hit reads the Plan for its buffers and configuration, and only an emission walks the
    tree, so a hit need not import :mod:`evtc.lower`. Attribute access is forwarded to the tree;
    pickling stores the tree itself. An entry whose tree can't be read raises the memo's
    :class:`pickle.UnpicklingError` at that first use (the entry was verified when read)."""

    __slots__ = ("_data", "_base", "_kernel_graph", "_tree")

    def __init__(self, data: bytes, base: list, kernel_graph) -> None:
        self._data, self._base, self._kernel_graph, self._tree = data, base, kernel_graph, None

    def load(self) -> Any:
        tree = self._tree
        if tree is None:  # two threads may both read it: equal trees over the same nodes
            tree = self._tree = _loads(self._data, _tree_nodes(self._base, self._kernel_graph))
        return tree

    def __getattr__(self, name: str) -> Any:
        return getattr(self.load(), name)

    def __reduce__(self):
        return (_identity, (self.load(),))

    def __repr__(self) -> str:
        return repr(self.load())


def _identity(x: Any) -> Any:
    return x


def _dumps(obj: Any, base: list | None) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    if base is not None:
        index = {id(n): k for k, n in enumerate(base)}

        def persistent_id(o: Any):
            k = index.get(id(o))
            return ("n", k) if k is not None and o is base[k] else None

        p.persistent_id = persistent_id  # type: ignore[method-assign]
    p.dump(obj)
    return buf.getvalue()


def _loads(data: bytes, base: list | None) -> Any:
    return _Unpickler(data, base).load()


# --------------------------------------------------------------------------------------------
# Entries on disk
# --------------------------------------------------------------------------------------------

def _path(root, key: str, kind: str) -> Path:
    return root.sub("construct", key[:2], f"{key}.{kind}")


def _read(root, key: str, kind: str) -> bytes | None:
    """The verified payload of an entry, or None (missing, or refused: logged at debug level)."""
    from evtc.compiler import trust

    path = _path(root, key, kind)
    if not os.path.lexists(path):
        return None
    try:
        data = trust.read(path, max_bytes=MAX_ENTRY_BYTES, root=root.path)
    except trust.Untrusted as e:
        log.debug("construct memo: ignored %s: %s", path, e)
        return None
    head, sep, payload = data.partition(b"\n")
    try:
        header = trust.load_json(head, str(path)) if sep else None
    except trust.Untrusted:
        header = None
    want = {"schema": SCHEMA, "kind": kind, "key": key}
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in want.items()):
        log.debug("construct memo: ignored %s: its header is not this schema/kind/key (%r)", path, head[:200])
        return None
    if header.get("bytes") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        log.debug("construct memo: ignored %s: its payload does not match its header (truncated or edited)", path)
        return None
    try:
        os.utime(path)  # a use: `evtc cache prune --older-than` removes entries by this time
    except OSError:
        pass  # a read-only cache
    return payload


def _write(root, key: str, kind: str, payload: bytes) -> None:
    """Write an entry atomically (a private temporary file renamed into place); failures are
    logged at debug level and otherwise ignored (a read-only cache: recompute next time)."""
    path = _path(root, key, kind)
    header = json.dumps({"schema": SCHEMA, "kind": kind, "key": key, "bytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}, sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        for d in (path.parent.parent, path.parent):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header + b"\n" + payload)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        log.debug("construct memo: can't write %s: %s", path, e)


# --------------------------------------------------------------------------------------------
# The memo of one traced graph
# --------------------------------------------------------------------------------------------

def _tagged(o: Any) -> Any:
    """``o`` as JSON with every container tagged by its type (a tuple and a list of the same
    items are different key material)."""
    if o is None or isinstance(o, (bool, int, float, str)):
        return o
    if isinstance(o, tuple):
        return ["tuple", [_tagged(x) for x in o]]
    if isinstance(o, list):
        return ["list", [_tagged(x) for x in o]]
    if isinstance(o, dict):
        return ["dict", sorted(([_tagged(k), _tagged(v)] for k, v in o.items()), key=json.dumps)]
    if isinstance(o, (set, frozenset)):
        return ["set", sorted((_tagged(x) for x in o), key=json.dumps)]
    if isinstance(o, enum.Enum):
        return ["enum", repr(o)]
    from evtc.dtypes import DType

    if isinstance(o, DType):
        return ["dtype", o.name]
    raise TypeError(f"a {type(o).__name__} is not key material")


def _canonical(obj: Any) -> str:
    return json.dumps(_tagged(obj), separators=(",", ":"))


class Memo:
    """The memo entries of one traced graph (see NOTE [The construct memo]).

    Every method returns None or does nothing when an entry is missing, refused or can't be
    written; none raises.
    """

    def __init__(self, root, base: str) -> None:
        self._root = root
        self._base = base

    def _key(self, kind: str, material: dict) -> str | None:
        try:
            return _digest(self._base, kind, _canonical(material))
        except (TypeError, ValueError) as e:
            log.debug("construct memo: not memoised (%s)", e)
            return None

    # ---- the post-pass graph of an arch ----

    def graph(self, arch: str):
        """The post-pass Graph for ``arch`` stored before, or None."""
        from evtc.ir.graph import Graph

        key = self._key("graph", {"arch": arch})
        payload = _read(self._root, key, "graph") if key else None
        if payload is None:
            return None
        try:
            g = _loads(payload, None)
        except Exception as e:
            log.debug("construct memo: ignored the graph entry %s: %s: %s", key, type(e).__name__, e)
            return None
        if not isinstance(g, Graph):
            log.debug("construct memo: ignored the graph entry %s: holds a %s", key, type(g).__name__)
            return None
        return g

    def put_graph(self, arch: str, graph) -> None:
        """Store the post-pass Graph for ``arch``."""
        key = self._key("graph", {"arch": arch})
        if key is None:
            return
        try:
            payload = _dumps(graph, None)
        except (RecursionError, pickle.PicklingError, TypeError, AttributeError) as e:
            log.debug("construct memo: graph of %s not stored: %s", graph.name, e)
            return
        _write(self._root, key, "graph", payload)

    # ---- one kernel's plan (and swap-AB graph) and source ----

    def plan(self, base_graph, material: dict):
        """``(kernel graph, Plan)`` of the kernel ``material`` describes, or None. Nodes of
        ``base_graph`` (the post-pass graph the kernel was planned from) come back as the very
        objects of ``base_graph``, as they are when the plan is computed."""
        from evtc.ir.graph import Graph
        from evtc.plan.model import Plan

        key = self._key("plan", material)
        payload = _read(self._root, key, "plan") if key else None
        if payload is None:
            return None
        base = _all_nodes(base_graph) + [base_graph]
        try:
            kernel_graph, plan, tree = _loads(payload, base)
        except Exception as e:
            log.debug("construct memo: ignored the plan entry %s: %s: %s", key, type(e).__name__, e)
            return None
        if not isinstance(kernel_graph, Graph) or not isinstance(plan, Plan) or not isinstance(tree, bytes):
            log.debug("construct memo: ignored the plan entry %s: holds %s, %s, %s", key, type(kernel_graph).__name__,
                      type(plan).__name__, type(tree).__name__)
            return None
        object.__setattr__(plan, "tree", _LazyTree(tree, base, kernel_graph))  # Plan is frozen; tree is compare=False
        return kernel_graph, plan

    def put_plan(self, base_graph, material: dict, kernel_graph, plan) -> None:
        """Store a kernel's graph (``base_graph`` itself, or its swap-AB transpose) and Plan."""
        key = self._key("plan", material)
        if key is None:
            return
        base = _all_nodes(base_graph) + [base_graph]
        try:
            tree = _dumps(_real_tree(plan.tree), _tree_nodes(base, kernel_graph))
            payload = _dumps((kernel_graph, dataclasses.replace(plan, tree=None), tree), base)
        except (RecursionError, pickle.PicklingError, TypeError, AttributeError) as e:
            log.debug("construct memo: plan of %s not stored: %s", base_graph.name, e)
            return
        _write(self._root, key, "plan", payload)

    def source(self, material: dict) -> str | None:
        """The emitted source of the kernel ``material`` describes, or None."""
        key = self._key("source", material)
        payload = _read(self._root, key, "source") if key else None
        if payload is None:
            return None
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError:
            log.debug("construct memo: ignored the source entry %s: not UTF-8", key)
            return None

    def put_source(self, material: dict, source: str) -> None:
        """Store a kernel's emitted source."""
        key = self._key("source", material)
        if key is not None:
            _write(self._root, key, "source", source.encode("utf-8"))


def traced_text(expr: str, *, c, d, parse):
    """The Graph of a textual epilogue: ``parse()`` (the text frontend: lark and its grammar)
    once, then read back from a ``.trace`` entry keyed by the text, ``c``, ``d``, evtc's sources
    and the op table. A text that fails to parse is not stored: ``parse()`` raises again.

    Args:
        expr: the epilogue's text.
        c, d: the dtypes ``parse`` is given (DType or None).
        parse: computes the Graph (and raises the frontend's located errors).

    Returns:
        The Graph ``parse()`` returns (or returned in an earlier process).
    """
    from evtc.ir.graph import Graph

    root = _root()
    table = ops_text() if root is not None else None
    key = None
    if root is not None and table is not None and isinstance(expr, str):
        try:
            key = _digest(*_common(root), table, "trace", repr(c), repr(d), expr)
        except Exception as e:  # unreadable sources: no memo, never an error
            log.debug("construct memo off for a text: %s: %s", type(e).__name__, e)
    payload = _read(root, key, "trace") if key is not None else None
    if payload is not None:
        try:
            g = _loads(payload, None)
        except Exception as e:
            log.debug("construct memo: ignored the trace entry %s: %s: %s", key, type(e).__name__, e)
            g = None
        if isinstance(g, Graph):
            return g
        log.debug("construct memo: ignored the trace entry %s: holds a %s", key, type(g).__name__)
    g = parse()
    if key is not None:
        try:
            _write(root, key, "trace", _dumps(g, None))
        except (RecursionError, pickle.PicklingError, TypeError, AttributeError) as e:
            log.debug("construct memo: trace of %s not stored: %s", getattr(g, "name", "?"), e)
    return g


def memo_for(traced) -> Memo | None:
    """The memo of a traced graph, or None when the memo is off (``EVTC_CONSTRUCT_MEMO=0``, no
    cache directory yet, a shared cache, ``EVTC_VERIFY``/``EVTC_DEBUG`` set to something the
    passes refuse, an op registered or replaced at run time: :func:`ops_text`) or the graph's
    dump can't be made. Never raises.

    Args:
        traced: the Graph a frontend made (before passes).
    """
    root = _root()
    if root is None:
        return None
    # The verification setting (NOTE [Verification setting] in evtc.passes.manager), read raw so
    # that this needn't import the passes; a value the passes would refuse turns the memo off, so
    # the construct runs them and raises their ConfigError.
    verify = [knobs.verify.raw(), knobs.debug.raw()]
    if any(v is not None and v.strip().lower() not in _ON_OFF for v in verify):
        return None
    try:
        table = ops_text()
        if table is None:
            log.debug("construct memo off for %s: an op of the table was registered or replaced at run time",
                      getattr(traced, "name", "?"))
            return None
        common = _common(root)
        text = graph_text(traced)
    except Exception as e:  # unreadable sources, a field whose repr fails: no memo, never an error
        log.debug("construct memo off for %s: %s: %s", getattr(traced, "name", "?"), type(e).__name__, e)
        return None
    base = _digest(*common, f"verify={verify!r}", table, text)
    return Memo(root, base)
