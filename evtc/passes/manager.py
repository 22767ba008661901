"""The pass manager: runs Graph -> PassResult passes in a checked order, verifies between them
and turns any internal failure into a located :class:`~evtc.errors.PassError`.

Input: a Graph and a sequence of :class:`Pass`. Output: a :class:`PassResult`.

Modelled on torch.fx's ``PassManager`` (``PassResult(graph, modified)``, failures re-raised
naming the pass and the passes before it) and CUTLASS's Python EVT passes (each declares the
passes it ``requires`` before it and checks what it ``ensures`` after it):

* a :class:`Pass` is a name, a function ``Graph -> PassResult``, the names of the passes that
  must run before it (checked when a :class:`PassManager` is made) and an optional ``ensures``
  check of its postcondition;
* with verification on (:func:`verification_enabled`), the manager runs the IR verifier
  (:func:`evtc.ir.verify.verify`) and the pass's ``ensures`` after every pass; a failure is an
  :class:`~evtc.errors.IRVerificationError` that names the pass and the passes run before it;
* an :class:`~evtc.errors.EvtcError` raised by a pass (a located user error such as a
  :class:`~evtc.errors.LegalizeError`) passes through; any other exception (a bug in evtc) is
  wrapped into a :class:`~evtc.errors.PassError` naming the pass, the passes run before it and
  showing the IR around the node the pass was visiting (passes report the node through
  :func:`visit` or :func:`rewrite`), with the original exception as ``__cause__``.

NOTE [Verification setting]
    Verification is an explicit setting, never inferred from what is imported: the ``verify=``
    argument of :class:`PassManager` / :func:`evtc.passes.run`, else the ``EVTC_VERIFY``
    environment variable (``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``),
    else on in debug mode (``EVTC_DEBUG=1``), else off. ``tests/conftest.py`` sets
    ``EVTC_VERIFY=1`` for the test suite. The rules a user can break are enforced whatever the
    setting (the ``propagate`` and ``legalize`` passes always run): verification only adds the
    checks that catch evtc's own bugs.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Callable, Iterable, Iterator, Sequence

from evtc import knobs
from evtc.errors import EvtcError, IRVerificationError, PassError
from evtc.ir.graph import Graph, GraphBuilder, Rule, rebuild, with_inputs
from evtc.ir.nodes import Node
from evtc.ir.printer import window
from evtc.ir.verify import Violation, format_violation, violations

__all__ = ["Pass", "PassManager", "PassResult", "at", "rewrite", "verification_enabled", "visit"]


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What a pass returns (torch.fx's ``PassResult``).

    Attributes:
        graph: the graph after the pass.
        changed: whether it differs from the input (some output or input is a different
            node; nodes are immutable, so equal outputs mean an equal graph).
    """

    graph: Graph
    changed: bool

    @classmethod
    def of(cls, before: Graph, after: Graph) -> "PassResult":
        """The result of a pass that turned ``before`` into ``after``, ``changed`` computed by
        node identity of the outputs and declared inputs."""
        same = (len(before.outputs) == len(after.outputs) and len(before.inputs) == len(after.inputs)
                and all(a is b for a, b in zip(before.outputs, after.outputs))
                and all(a is b for a, b in zip(before.inputs, after.inputs)))
        return cls(after, not same)


#: a postcondition check: the first violation of what the pass guarantees, or None
Ensures = Callable[[Graph], "Violation | None"]


@dataclasses.dataclass(frozen=True)
class Pass:
    """One pass of a pipeline.

    Attributes:
        name: the pass's name (unique in a pipeline), named in errors.
        fn: ``Graph -> PassResult``.
        requires: names of the passes that must run before this one.
        ensures: checks the pass's postcondition on its output; run after the pass when
            verification is on.
    """

    name: str
    fn: Callable[[Graph], PassResult]
    requires: tuple[str, ...] = ()
    ensures: Ensures | None = None

    def __call__(self, graph: Graph) -> PassResult:
        return self.fn(graph)


def verification_enabled() -> bool:
    """Whether the manager verifies after every pass by default (NOTE [Verification setting]).

    Returns:
        ``EVTC_VERIFY`` if set, else ``EVTC_DEBUG`` if set, else False.

    Raises:
        ConfigError: either variable holds something other than an on/off value.
    """
    verify = knobs.verify.get()
    if verify is not None:
        return verify
    return bool(knobs.debug.get())


# ---- where a pass is: the node it is visiting, for error messages --------------------------------

@dataclasses.dataclass
class _Cursor:
    node: Node | None = None


_cursor: contextvars.ContextVar[_Cursor | None] = contextvars.ContextVar("evtc_pass_cursor", default=None)


def at(node: Node) -> None:
    """Record ``node`` as the node the running pass is working on, so that an internal failure
    shows the IR around it (a no-op outside a :class:`PassManager`)."""
    cursor = _cursor.get()
    if cursor is not None:
        cursor.node = node


def visit(nodes: Iterable[Node]) -> Iterator[Node]:
    """Iterate over ``nodes``, recording each as the node the running pass is at (:func:`at`).
    Use it for passes that only look."""
    cursor = _cursor.get()
    for n in nodes:
        if cursor is not None:
            cursor.node = n
        yield n


def rewrite(graph: Graph, rule: Rule | None = None, *, builder: GraphBuilder | None = None) -> Graph:
    """:func:`evtc.ir.graph.rebuild`, recording the node being rewritten (see :func:`visit`).

    Args:
        graph: the graph to rewrite.
        rule: ``rule(node, new_inputs, builder) -> Node``, as for ``rebuild``.
        builder: the builder to intern into (default: a fresh one).

    Returns:
        The rebuilt graph.
    """
    cursor = _cursor.get()
    if cursor is None:
        return rebuild(graph, rule, builder=builder)

    def located(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        cursor.node = node
        return rule(node, inputs, b) if rule is not None else with_inputs(node, inputs)

    return rebuild(graph, located, builder=builder)


# ---- the manager ----------------------------------------------------------------------------------

class PassManager:
    """Runs passes in order (torch.fx's ``PassManager``, one round: the pipeline's order is
    chosen so that one round reaches the intended form, and the emitted code depends on it).

    Args:
        passes: the passes, in order.
        verify: verify after every pass; None reads the setting (:func:`verification_enabled`)
            each time the manager runs.

    Raises:
        ValueError: a pass's ``requires`` names a pass that doesn't run before it, or two
            passes share a name.

    Example::

        result = PassManager(evtc.passes.pipeline("sm90"))(graph)
        result.graph, result.changed
    """

    def __init__(self, passes: Sequence[Pass], *, verify: bool | None = None) -> None:
        seen: set[str] = set()
        for p in passes:
            if p.name in seen:
                raise ValueError(f"pass '{p.name}' appears twice in the pipeline")
            missing = [r for r in p.requires if r not in seen]
            if missing:
                raise ValueError(f"pass '{p.name}' requires {missing} to run before it")
            seen.add(p.name)
        self.passes = tuple(passes)
        self.verify = verify

    def __call__(self, graph: Graph) -> PassResult:
        """Run every pass on ``graph``.

        Returns:
            The final graph, and whether any pass changed it.

        Raises:
            EvtcError: a located user error from a pass (type, constant folding, legalization).
            IRVerificationError: with verification on, a pass broke an IR invariant or its
                ``ensures``; the message names the pass and the passes run before it.
            PassError: a pass failed with an internal exception.
        """
        verify = verification_enabled() if self.verify is None else self.verify
        done: list[str] = []
        changed = False
        for p in self.passes:
            result = self._run_one(p, graph, done)
            graph = result.graph
            changed |= result.changed
            done.append(p.name)
            if verify:
                self._check(p, graph, done)
        return PassResult(graph, changed)

    def _run_one(self, p: Pass, graph: Graph, done: list[str]) -> PassResult:
        cursor = _Cursor()
        token = _cursor.set(cursor)
        try:
            result = p.fn(graph)
        except EvtcError as err:
            raise err.with_context(epilogue=graph.name)
        except Exception as exc:
            raise _wrap(p, graph, done, cursor.node, exc) from exc
        finally:
            _cursor.reset(token)
        if not isinstance(result, PassResult):
            raise PassError(f"pass '{p.name}' returned {type(result).__name__}, not a PassResult",
                            epilogue=graph.name, hint=_REPORT)
        return result

    @staticmethod
    def _check(p: Pass, graph: Graph, done: list[str]) -> None:
        found = next(violations(graph), None)
        if found is None and p.ensures is not None:
            try:
                found = p.ensures(graph)
            except Exception as exc:
                raise _wrap(p, graph, done[:-1], None, exc, doing="checking what it ensures") from exc
            if found is not None:
                found = dataclasses.replace(found, message=f"it ensures '{found.rule}', but {found.message}")
        if found is not None:
            v = found
            raise IRVerificationError(
                format_violation(graph, v, after=p.name) + f"\n  (passes run: {', '.join(done)})",
                loc=getattr(found.node, "loc", None), epilogue=graph.name, hint=_REPORT,
            )


_REPORT = ("this is a bug in evtc: please report it with the IR shown (EVTC_TRACEBACK=full keeps the "
           "original traceback)")


def _wrap(p: Pass, graph: Graph, before: list[str], node: Node | None, exc: Exception,
          doing: str = "") -> PassError:
    """The PassError for ``exc`` raised inside pass ``p`` while at ``node`` of ``graph``."""
    detail = str(exc) or type(exc).__name__
    if len(detail) > 300:
        detail = detail[:300] + "..."
    lines = [f"internal error in pass '{p.name}'{' ' + doing if doing else ''}: {type(exc).__name__}: {detail}",
             f"  passes run before it: {', '.join(before) if before else '(none)'}"]
    if node is not None:
        w = _window_around(graph, node)
        if w:
            lines.append(w)
    return PassError("\n".join(lines), loc=getattr(node, "loc", None), epilogue=graph.name, hint=_REPORT)


def _window_around(graph: Graph, node: Node) -> str:
    """IR lines around ``node``, or around its first user when ``node`` has no line of its own
    (a leaf or a constant); empty when neither can be printed."""
    try:
        w = window(graph, node)
        if not w:
            users = graph.users_of(node)
            if users:
                w = window(graph, users[0])
        return w
    except Exception:  # an error while describing an error must not hide it
        return ""
