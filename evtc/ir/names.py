"""The rule for names that reach emitted C++: parameter, output and epilogue names.

Input: a name (any object a user gave as one). Output: ``None`` when the name is fine, else the
words saying what is wrong with it (:func:`name_problem`), and the reason a name is reserved
(:func:`reserved_parameter`, :func:`reserved_output`).

Every name of a graph reaches generated code: parameter and output names become fields of the C
argument struct (``p_bias``, ``ld_D``, ``s_alpha``: ``evtc/abi.py``), members of the sm80
reduction scratch struct (the bare output name), Python keyword arguments of
``Gemm.__call__(A, B, *, out=None, stream=None, **kwargs)``, and, with the epilogue's name,
comments of the emitted ``.cu`` and the file names of ``EVTC_DUMP_DIR``/``EVTC_OVERRIDE_DIR``.
So a name must be:

* an ASCII identifier (``[A-Za-z_][A-Za-z0-9_]*``) of at most :data:`MAX_NAME_LENGTH`
  characters: no newline can end a C++ comment, no ``/`` or ``..`` can leave a folder;
* not a C++ keyword or alternative token (``int``, ``class``, ``and``...), nor reserved to the
  implementation by the C++ standard ([lex.name]: starting with ``__`` or with ``_`` and a
  capital letter: ``__shared__``, ``_Float16``), nor an object-like macro of the headers the
  kernel includes (``NULL``, ``errno``, ``INFINITY``...) or in their macro namespaces
  (``CUTLASS_*``, ``CUTE_*``, ``CUDA_*``, ``CUDART_*``);
* ``inf`` and ``nan`` read as numbers in the IR text, so neither names anything.

Some names are reserved by the runtime: a parameter can't be called ``A`` or ``B`` (the GEMM
operands: their ``p_A``/``ld_A``/``bs_A`` fields and the positional arguments of
``Gemm.__call__``), ``out``, ``stream`` or ``self`` (keywords of ``Gemm.__call__``); an output
can't be called ``A`` or ``B`` either (the same struct fields).

The frontends turn a problem into a located error (:mod:`evtc.frontend.builder`); this module
only states the rule, so the IR verifier and other stages can check it too.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NAME_LENGTH", "CXX_KEYWORDS", "name_problem", "reserved_parameter", "reserved_output"]

#: the longest name accepted (characters)
MAX_NAME_LENGTH = 64

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: C++20 keywords and alternative tokens ([lex.key], [lex.digraph]), and CUDA's memory-space
#: words that nvcc treats as keywords in device code
CXX_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void
    volatile wchar_t while xor xor_eq
""".split())

#: object-like macros of the C and C++ headers an emitted kernel includes (a name that is one
#: would be replaced by the preprocessor where the name is emitted bare)
_MACROS = frozenset("""
    NULL EOF errno INFINITY NAN HUGE_VAL HUGE_VALF HUGE_VALL CHAR_BIT CHAR_MAX CHAR_MIN SCHAR_MAX
    SCHAR_MIN UCHAR_MAX SHRT_MAX SHRT_MIN USHRT_MAX INT_MAX INT_MIN UINT_MAX LONG_MAX LONG_MIN
    ULONG_MAX LLONG_MAX LLONG_MIN ULLONG_MAX SIZE_MAX PTRDIFF_MAX PTRDIFF_MIN FLT_MAX FLT_MIN
    FLT_EPSILON DBL_MAX DBL_MIN DBL_EPSILON EXIT_SUCCESS EXIT_FAILURE RAND_MAX BUFSIZ FILENAME_MAX
    M_PI M_E M_SQRT2 M_LN2
""".split())

_MACRO_PREFIXES = ("CUTLASS_", "CUTE_", "CUDA_", "CUDART_")

_RESERVED_PARAMETERS = {
    "A": "it is the GEMM's A operand (Gemm.__call__'s first argument, and the p_A/ld_A/bs_A fields of the C ABI)",
    "B": "it is the GEMM's B operand (Gemm.__call__'s second argument, and the p_B/ld_B/bs_B fields of the C ABI)",
    "out": "Gemm.__call__ takes the preallocated outputs as out=",
    "stream": "Gemm.__call__ takes the CUDA stream as stream=",
    "self": "Gemm.__call__ is a method, so a keyword argument 'self' can't be passed to it (for a method, "
            "trace the bound method obj.method)",
    "inf": "the IR text reads it as a number",
    "nan": "the IR text reads it as a number",
    # (the expression form made these runtime scalars: `D = acc * NaN` asked for an argument NaN)
    **{w: "it is a Python constant: the expression form has no booleans or None (write a number)"
       for w in ("True", "False", "None")},
    **{w: f"the expression form writes it {w.lower()[:3]} (a number, in lower case)"
       for w in ("NaN", "NAN", "Nan", "Inf", "INF", "Infinity", "infinity")},
}
_RESERVED_OUTPUTS = {
    "A": "the C ABI names the GEMM's A operand p_A/ld_A/bs_A",
    "B": "the C ABI names the GEMM's B operand p_B/ld_B/bs_B",
    "inf": "the IR text reads it as a number",
    "nan": "the IR text reads it as a number",
}


def name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a name that reaches C++, or None when nothing is.

    The answer completes a sentence that starts with the name, e.g. ``"is not an identifier"``.

    Example::

        name_problem("bias")            # None
        name_problem("x\\n#error")       # 'is not an identifier'
        name_problem("int")             # 'is a C++ keyword'
    """
    if not isinstance(name, str) or not name.isidentifier():
        return "is not an identifier"
    if not name.isascii():
        return "is not ASCII (C++ identifiers in the emitted kernel are ASCII)"
    if not _IDENTIFIER.match(name):  # pragma: no cover - isidentifier + isascii imply it
        return "is not an identifier"
    if len(name) > MAX_NAME_LENGTH:
        return f"is longer than {MAX_NAME_LENGTH} characters ({len(name)})"
    if name in CXX_KEYWORDS:
        return "is a C++ keyword"
    if name.startswith("__") or (name[0] == "_" and name[1:2].isupper()):
        return "is reserved in C++ (names starting with '__' or with '_' and a capital letter belong to the compiler)"
    if name in _MACROS or name.startswith(_MACRO_PREFIXES):
        return "is (or looks like) a macro of the C, CUDA or CUTLASS headers the kernel includes"
    return None


def reserved_parameter(name: str) -> str | None:
    """Why a parameter (an input) can't have ``name``, or None when it can."""
    return _RESERVED_PARAMETERS.get(name)


def reserved_output(name: str) -> str | None:
    """Why an output can't have ``name``, or None when it can."""
    return _RESERVED_OUTPUTS.get(name)
