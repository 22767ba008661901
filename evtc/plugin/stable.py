"""Marking the plugin API stable, and the text of its signatures that a golden file pins.

Input: the functions, classes and constants of :mod:`evtc.plugin` decorated with
:func:`stable`. Output: :func:`signatures`, one line per stable name (its call signature, or for
a dataclass its fields in order, and for a class each public method), which
``tests/null/test_plugin_api.py`` compares with ``tests/golden/plugin_api.txt``.

NOTE [Stable plugin API]
Other generators build on the fragment contract, so a change to what :func:`stable` marks is a
change to the contract: the golden file shows it as a diff in review. Adding a field with a
default, a keyword argument with a default or a new method keeps version
:data:`~evtc.plugin.fragment.FRAGMENT_VERSION`; renaming, removing or changing the meaning of
anything marked stable needs a new version (docs/plugin.md, "Versioning"). This is torch.fx's
``@compatibility(is_backward_compatible=True)`` with its back-compat expect file.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, TypeVar

__all__ = ["stable", "stable_constant", "stable_api", "signatures"]

T = TypeVar("T")

_REGISTRY: dict[str, tuple[Any, int]] = {}


def stable(since: int) -> Callable[[T], T]:
    """Mark a function or class as part of the stable plugin API since fragment version ``since``.

    Args:
        since: the :data:`~evtc.plugin.fragment.FRAGMENT_VERSION` that introduced it (>= 1).

    Returns:
        A decorator that records the object (under ``module.qualname``) and sets its
        ``__evtc_stable__`` attribute to ``since``; the object itself is returned unchanged.

    Raises:
        ValueError: ``since`` is not a positive integer (a mistake in evtc, not a user error).
    """
    if isinstance(since, bool) or not isinstance(since, int) or since < 1:
        raise ValueError(f"stable(since={since!r}): a fragment version >= 1")

    def mark(obj: T) -> T:
        target = getattr(obj, "__wrapped__", obj)
        for o in {id(obj): obj, id(target): target}.values():
            try:
                o.__evtc_stable__ = since  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
        _REGISTRY[f"{target.__module__}.{target.__qualname__}"] = (obj, since)
        return obj

    return mark


def stable_constant(qualname: str, value: Any, since: int) -> None:
    """Mark a module-level constant (``"evtc.plugin.fragment.FRAGMENT_VERSION"``) stable; its
    value is part of the signature text."""
    stable(since)  # validates since
    _REGISTRY[qualname] = (value, since)


def stable_api() -> dict[str, tuple[Any, int]]:
    """Every object marked :func:`stable`: ``module.qualname -> (object, since)``, sorted by name."""
    import evtc.plugin  # noqa: F401  (importing the package registers its stable objects)

    return dict(sorted(_REGISTRY.items()))


def _signature(fn: Callable) -> str:
    return str(inspect.signature(getattr(fn, "__wrapped__", fn)))


def _field_line(f: dataclasses.Field) -> str:
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
    if f.default is not dataclasses.MISSING:
        return f"    {f.name}: {typ} = {f.default!r}"
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f"    {f.name}: {typ} = <factory>"
    return f"    {f.name}: {typ}"


def signatures() -> str:
    """The stable plugin API as text: one block per stable object, sorted by name.

    A function gives ``def name(signature)``; a class gives ``class name`` followed by its
    dataclass fields in order (type and default) and each public method and property with its
    signature. Annotations are shown as written in the source (the modules use
    ``from __future__ import annotations``), so the text does not depend on the Python version.

    Returns:
        The text, ending with a newline.
    """
    lines: list[str] = []
    for name, (obj, since) in stable_api().items():
        target = getattr(obj, "__wrapped__", obj)
        if inspect.isclass(target):
            lines.append(f"class {name}  # stable since {since}")
            if dataclasses.is_dataclass(target):
                lines += [_field_line(f) for f in dataclasses.fields(target)]
            for attr, value in sorted(vars(target).items()):
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    lines.append(f"    @property {attr}")
                elif isinstance(value, (staticmethod, classmethod)):
                    lines.append(f"    {type(value).__name__} {attr}{_signature(value.__func__)}")
                elif inspect.isfunction(value):
                    lines.append(f"    def {attr}{_signature(value)}")
        elif callable(target):
            lines.append(f"def {name}{_signature(target)}  # stable since {since}")
        else:
            lines.append(f"{name} = {target!r}  # stable since {since}")
    return "\n".join(lines) + "\n"
