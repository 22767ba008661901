"""Recursion without the Python stack, for the walks over epilogue graphs and visitor trees.

Input: a recursive function written as a generator. Output: its result, computed with an explicit
stack, so a chain of thousands of nodes can't raise RecursionError.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, TypeVar

__all__ = ["trampoline"]

A = TypeVar("A")
R = TypeVar("R")


def trampoline(fn: Callable[[A], Generator[A, R, R]], arg: A) -> R:
    """Evaluate the recursive function ``fn(arg)`` with an explicit stack.

    ``fn`` is a generator function: where the recursive version would call ``fn(x)``, it
    ``yield``\\ s ``x`` and receives the sub-call's result; it ``return``\\ s its own result.

    Example::

        def depth(t):
            kids = []
            for c in t.children:
                kids.append((yield c))
            return 1 + max(kids, default=0)

        trampoline(depth, tree)
    """
    stack: list[Generator[A, R, R]] = [fn(arg)]
    result: Any = None
    while stack:
        try:
            sub = stack[-1].send(result)
        except StopIteration as stop:
            stack.pop()
            result = stop.value
            continue
        stack.append(fn(sub))
        result = None
    return result
