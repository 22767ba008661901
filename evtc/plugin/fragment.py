"""The epilogue fragment: what another kernel generator needs to use an evtc epilogue.

Input: built by :func:`evtc.plugin.lower` from a planned epilogue. Output: an
:class:`EpilogueFragment` (a frozen, versioned record: C++ declarations, the plan's
collective-epilogue parameters, the ``Arguments`` initializer with named placeholders, the
run-time parameters), which a generator pastes into its kernel source or writes as a header
(:meth:`EpilogueFragment.header`; ``evtc emit --fragment``).

The contract (docs/plugin.md) is version :data:`FRAGMENT_VERSION`; everything marked
:func:`~evtc.plugin.stable.stable` here is pinned by ``tests/golden/plugin_api.txt``
(NOTE [Stable plugin API]).

NOTE [Fragment placeholders]
The initializer texts (:attr:`EpilogueFragment.epilogue_arguments`,
:attr:`EpilogueFragment.fusion_arguments`) name every run-time value as ``${name}``, Python's
``string.Template`` syntax: ``$`` occurs nowhere else in the emitted C++, so a generator binds
them with ``string.Template(text).substitute(values)``, a C++ generator with one textual
replacement per name, and :meth:`EpilogueFragment.bind` does it with checks. The names are
those of evtc's own C ABI (:mod:`evtc.abi`): ``p_<tensor>`` a pointer (``void const*`` for
inputs, ``void*`` for outputs: any pointer expression ``static_cast`` accepts as the element
pointer), ``ld_<tensor>`` the leading dimension of an M x N tensor (``int64_t``, elements
between rows), ``bs_<tensor>`` the batch stride (``int64_t``, elements between batches, 0 for
one tensor shared by every batch), ``s_<scalar>`` a by-value scalar (``float``). The header
form binds the same names to the fields of a ``Params`` struct (``args.p_bias``...), so the
header and the text can't disagree.
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any, Callable, Mapping

from evtc.errors import EvtcError, FragmentError
from evtc.plugin.stable import stable, stable_constant

__all__ = ["FRAGMENT_VERSION", "EpilogueFragment", "Parameter", "Placeholder"]

#: The version of the fragment contract (docs/plugin.md, "Versioning"). A fragment records the
#: version it was made under; a consumer checks it (``kFragmentVersion`` in the C++ header).
FRAGMENT_VERSION = 1
stable_constant("evtc.plugin.fragment.FRAGMENT_VERSION", FRAGMENT_VERSION, 1)

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _not_one_expression(text: str) -> str | None:
    """Why ``text`` is not one C++ expression that can stand as an element of an initializer
    (None where it can): empty, brackets that don't balance, or a comma, semicolon or comment
    outside brackets and literals. (A top-level comma would add an element and shift every field
    after it; a ``//`` comment would swallow the rest of the initializer's line.)"""
    if not text.strip():
        return "an empty expression"
    pairs, stack, quote, i = {")": "(", "]": "[", "}": "{"}, [], None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif text.startswith(("//", "/*"), i):
            return "a comment in the expression"
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != pairs[ch]:
                return f"an unbalanced '{ch}'"
        elif ch in ",;" and not stack:
            return f"a '{ch}' outside brackets: more than one expression"
        i += 1
    if quote:
        return "an unterminated literal"
    if stack:
        return f"an unclosed '{stack[-1]}'"
    return None


@stable(since=1)
@dataclasses.dataclass(frozen=True)
class Placeholder:
    """One named run-time value of the ``Arguments`` initializer (NOTE [Fragment placeholders]).

    Attributes:
        name: the placeholder, as written ``${name}`` in the initializer text and as the field
            of the header's ``Params`` struct: ``p_bias``, ``ld_C``, ``bs_C``, ``s_alpha``.
        ctype: its C type: ``const void*`` (input pointer), ``void*`` (output pointer),
            ``int64_t`` (a stride, in elements), ``float`` (a scalar value).
        tensor: the :class:`Parameter` it belongs to (``bias``, ``C``...).
        what: ``ptr``, ``ld`` (leading dimension: elements between rows), ``batch_stride``
            (elements between batches) or ``value`` (a by-value scalar).
    """

    name: str
    ctype: str
    tensor: str
    what: str

    def to_json(self) -> dict:
        """The placeholder as a JSON-serialisable dict."""
        return dataclasses.asdict(self)


@stable(since=1)
@dataclasses.dataclass(frozen=True)
class Parameter:
    """One run-time parameter of the epilogue: a tensor or scalar the generated kernel's caller
    passes, or an output it receives.

    Attributes:
        name: its name in the epilogue (``bias``, ``C``, ``D``, ``row_max``).
        kind: ``source`` (the M x N source C), ``aux_load`` (another M x N input),
            ``row_broadcast`` (length N), ``col_broadcast`` (length M), ``scalar`` (by value),
            ``device_scalar`` (one value per batch read from device memory), ``store`` (an
            M x N output: D or an aux store), ``row_reduction`` (over N: length M),
            ``col_reduction`` (over M: length N), ``scalar_reduction`` (over M and N),
            ``group_scale`` (evtc.quantize's f32 scales: (M, G) per batch, G = ceil(N / group),
            row ``ld`` and group ``gs`` strides as its layout says).
        io: ``input`` or ``output``.
        dtype: evtc's dtype name (``bf16``, ``f32``, ``e4m3``...).
        element: the CUTLASS element type (``cutlass::bfloat16_t``, ``float``).
        shape: its extents in terms of the problem, outermost first: ``("L", "M", "N")`` for
            M x N tensors (row-major: unit stride along N, ``ld`` between rows, ``bs`` between
            batches), ``("L", "N")`` / ``("L", "M")`` for vectors (unit stride, ``bs`` between
            batches), ``("L",)`` for device scalars and scalar reductions, ``()`` for by-value
            scalars. A batch stride of 0 shares one tensor between all L batches (inputs only).
        slot: ``C`` or ``D`` when the collective epilogue loads or stores it through its C or D
            slot (the plan decides: an aux load can take an empty C slot), else None.
        mode: where the plan put it: ``tma`` (TMA through shared memory), ``shared`` (inside
            another buffer), ``smem`` (a row broadcast's CTA-N row), ``direct``
            (register-direct: the kernel reads or writes whole 16-byte vectors, so N must be a
            multiple of 16 bytes of the element), ``registers``, ``workspace`` (row and column
            reductions: per-tile partials in the kernel's workspace), ``atomic`` (scalar
            reductions), ``value`` (by-value scalars).
        alignment: bytes the base address, and for M x N tensors ``ld`` and ``bs`` times the
            element size, must be multiples of (16 for TMA and register-direct tensors, the
            element size for vectors and reductions).
        placeholders: the names of its :class:`Placeholder` s, in order.
        reduce: ``sum``, ``max`` or ``min`` for reductions, else None.
        identity: the reduction's identity (0, -inf, inf): what an output over an empty extent
            holds; the kernel initialises and writes every element itself. None for others.
    """

    name: str
    kind: str
    io: str
    dtype: str
    element: str
    shape: tuple[str, ...]
    slot: str | None
    mode: str
    alignment: int
    placeholders: tuple[str, ...]
    reduce: str | None = None
    identity: float | None = None

    def to_json(self) -> dict:
        """The parameter as a JSON-serialisable dict (tuples as lists; infinite identities as
        the strings ``inf``/``-inf``)."""
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        d["placeholders"] = list(self.placeholders)
        if self.identity is not None and self.identity in (float("inf"), float("-inf")):
            d["identity"] = "inf" if self.identity > 0 else "-inf"
        return d


def _tuple3(x: Any) -> Any:
    return tuple(x) if isinstance(x, (list, tuple)) else x


@stable(since=1)
@dataclasses.dataclass(frozen=True, repr=False)
class EpilogueFragment:
    """An evtc epilogue, planned for one CTA tile and kernel schedule, as C++ a generator puts in
    its own CUTLASS 3.x sm90 GEMM (docs/plugin.md).

    The fragment is a C++ struct ``namespace::name`` (:attr:`qualified_name`) holding the fusion
    callbacks type (``FusionCallbacks``: pass it as the collective epilogue's
    ``FusionCallbacks`` parameter), the collective epilogue's planned parameters
    (``EpilogueTile``, ``StagesC``...) and a ready ``CollectiveEpilogue``, the plan's numbers
    (``SharedStorageBytes``, ``MainloopStages``), and a ``Params`` struct with
    ``arguments(Params)`` building ``CollectiveEpilogue::Arguments``. The same values are
    attributes here, for generators that write C++ text.

    Attributes:
        version: :data:`FRAGMENT_VERSION` when it was made.
        name: the C++ struct's name (the caller's choice).
        namespace: the C++ namespace it is declared in (``a`` or ``a::b``).
        epilogue: the epilogue's name.
        arch: ``sm90``.
        ir: the epilogue's canonical IR text after evtc's passes.
        tile: CTA tile (M, N, K) it was planned for; the kernel must use this tile.
        schedule: ``cooperative`` or ``pingpong``; the kernel must use this schedule.
        cluster: cluster shape (M, N, 1) it was planned with (the epilogue does not depend on
            it: :meth:`check` accepts any legal cluster).
        a, b: dtype names of the mainloop operands it was planned with (they size the mainloop
            stages that remain beside the epilogue).
        stages: mainloop stages it was planned for, or None for as many as fit
            (``StageCountAutoCarveout``).
        kernel_schedule: the CUTLASS kernel schedule type of ``schedule``
            (``cutlass::gemm::KernelTmaWarpSpecializedCooperative``).
        epilogue_schedule: the CUTLASS epilogue schedule tag of ``schedule``
            (``cutlass::epilogue::TmaWarpSpecializedCooperative``), for generators that name one.
        epilogue_tile: (M, N) of the epilogue subtile (planned).
        stages_c: ``StagesC`` of ``Sm90TmaWarpSpecialized`` (C and the TMA aux loads).
        stages_d: ``StagesD`` (D and the TMA aux stores).
        fragment_size: ``FragmentSize`` (accumulator elements a thread visits per call).
        reuse_smem_c: ``ReuseSmemC``: D is written into C's buffer.
        delay_tma_store: ``DelayTmaStore``.
        c_input: the input loaded through the collective's C slot (the source C, or an aux
            load the plan promoted into an empty slot), or None (``ElementC`` is void).
        d_output: the output stored through the collective's D slot.
        element_c: CUTLASS type of the C slot (``void`` without one).
        element_d: CUTLASS type of the D slot.
        stride_c, stride_d: CuTe stride types of C and D (row-major M x N, batched).
        smem_bytes: ``sizeof(CollectiveEpilogue::SharedStorage)`` in bytes, as planned; the
            header ``static_assert``s it.
        mainloop_stages: mainloop stages the plan leaves beside the epilogue
            (``StageCountAutoCarveout<smem_bytes>`` for ``a``/``b`` at ``tile``), or ``stages``.
        mainloop_stage_bytes: bytes of one mainloop stage (A and B tiles and its barriers).
        smem_capacity: shared memory per block the plan fits in, in bytes (232448 on sm90).
        callbacks_type: the C++ name of the fusion callbacks type
            (``namespace::name::FusionCallbacks``).
        collective_epilogue_type: the C++ name of the fragment's collective epilogue
            (``namespace::name::CollectiveEpilogue``).
        declarations: the C++ declarations: the namespace with the struct (no includes).
        headers: every header the declarations ``#include``, in order (CUTLASS's, then evtc's).
        evtc_headers: evtc's own helper headers among them (``evtc/sm90_visitors.hpp``...),
            found under :attr:`include_dirs`.
        support_headers: headers a consumer includes in exactly one translation unit of its
            library (``evtc/driver_shim.hpp``: the CUDA driver calls CUTLASS makes directly,
            resolved at run time, so the library needs no ``-lcuda``), or links ``-lcuda``.
        fusion_arguments: the initializer of ``FusionCallbacks::Arguments`` with placeholders.
        epilogue_arguments: the initializer of ``CollectiveEpilogue::Arguments`` (the fusion
            arguments, ``ptr_C``, ``dC``, ``ptr_D``, ``dD``) with placeholders.
        placeholders: every :class:`Placeholder`, in the ``Params`` struct's order.
        parameters: every :class:`Parameter` (inputs in the epilogue's order, then outputs).
        preamble: the header's leading comment (the IR, the plan, the placeholders).
        plan: the :class:`evtc.plan.Plan` (informative: printable, not part of the contract).
        graph: the epilogue's Graph after passes (the reference interpreter's input; not part
            of the contract).
    """

    version: int
    name: str
    namespace: str
    epilogue: str
    arch: str
    ir: str
    tile: tuple[int, int, int]
    schedule: str
    cluster: tuple[int, int, int]
    a: str
    b: str
    stages: int | None
    kernel_schedule: str
    epilogue_schedule: str
    epilogue_tile: tuple[int, int]
    stages_c: int
    stages_d: int
    fragment_size: int
    reuse_smem_c: bool
    delay_tma_store: bool
    c_input: str | None
    d_output: str
    element_c: str
    element_d: str
    stride_c: str
    stride_d: str
    smem_bytes: int
    mainloop_stages: int
    mainloop_stage_bytes: int
    smem_capacity: int
    callbacks_type: str
    collective_epilogue_type: str
    declarations: str
    headers: tuple[str, ...]
    evtc_headers: tuple[str, ...]
    support_headers: tuple[str, ...]
    fusion_arguments: str
    epilogue_arguments: str
    placeholders: tuple[Placeholder, ...]
    parameters: tuple[Parameter, ...]
    preamble: str = dataclasses.field(default="", repr=False)
    plan: Any = dataclasses.field(default=None, compare=False, repr=False)
    graph: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        tile = "x".join(map(str, self.tile))
        return (f"<EpilogueFragment v{self.version} {self.qualified_name} of {self.epilogue}: tile {tile} {self.schedule}, "
                f"epilogue smem {self.smem_bytes} B, {self.mainloop_stages} mainloop stages>")

    # ---- names ------------------------------------------------------------------------------------

    @property
    def qualified_name(self) -> str:
        """``namespace::name``: the C++ struct."""
        return f"{self.namespace}::{self.name}"

    def parameter(self, name: str) -> Parameter:
        """The run-time parameter ``name``.

        Raises:
            FragmentError: the epilogue has no parameter of that name (the message lists them).
        """
        for p in self.parameters:
            if p.name == name:
                return p
        raise FragmentError(f"fragment {self.qualified_name} has no parameter '{name}'", epilogue=self.epilogue,
                            hint=f"its parameters: {', '.join(p.name for p in self.parameters)}")

    # ---- the build ----------------------------------------------------------------------------------

    @property
    def include_dirs(self) -> tuple[str, ...]:
        """The ``-I`` directories the declarations need, in search order: evtc's helper headers,
        then CUTLASS's (``evtc.compiler.include_dirs()``; machine-specific absolute paths).

        Raises:
            BuildError: the CUTLASS headers were not found (install ``nvidia-cutlass`` or set
                ``CUTLASS_PATH``).
        """
        from evtc.compiler.nvcc import include_dirs

        return tuple(str(d) for d in include_dirs())

    @property
    def nvcc_flags(self) -> tuple[str, ...]:
        """The nvcc flags the declarations need, as evtc builds its own kernels: the language
        and optimisation flags of ``evtc.compiler.nvcc.BASE_FLAGS`` (``-std=c++17``,
        ``--expt-relaxed-constexpr``, ``-O3 -DNDEBUG``...) and the arch's ``-gencode`` (sm90:
        ``sm_90a``, for WGMMA and ``setmaxnreg``). Without ``-I`` flags (:attr:`include_dirs`)
        and without the flags that decide what is built (``-shared``, ``-fPIC``, ``-o``),
        which are the consumer's."""
        from evtc.compiler.nvcc import BASE_FLAGS, arch_flags

        link = {"-shared", "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden"}
        return tuple(f for f in BASE_FLAGS if f not in link) + tuple(arch_flags(self.arch))

    # ---- C++ text -----------------------------------------------------------------------------------

    def header(self) -> str:
        """The fragment as a self-contained header: a comment with the IR, the plan and the
        placeholders, ``#pragma once``, the :attr:`headers` and the :attr:`declarations`.
        Deterministic: the same epilogue and arguments give the same bytes.

        Returns:
            The header text (what ``evtc emit --fragment`` writes), ending with a newline.
        """
        includes = "".join(f"#include <{h}>\n" for h in self.headers)
        return f"{self.preamble}#pragma once\n\n#include <cstdint>\n{includes}\n{self.declarations}"

    def bind(self, values: Mapping[str, str] | None = None, /, *, which: str = "epilogue", **more: str) -> str:
        """An initializer with every placeholder replaced by the caller's C++ expression.

        Args:
            values: placeholder name -> C++ expression, e.g. ``{"p_bias": "params.bias_ptr",
                "bs_bias": "0", "s_alpha": "1.0f"}``; every placeholder of the text must be
                given, and no other name.
            which: ``epilogue`` (:attr:`epilogue_arguments`, ``CollectiveEpilogue::Arguments``)
                or ``fusion`` (:attr:`fusion_arguments`, ``FusionCallbacks::Arguments``).
            **more: more placeholder values, as keywords.

        Returns:
            The C++ initializer text.

        Raises:
            FragmentError: a placeholder is missing, unknown, given twice, or its value is not
                a string (or a number, which is written as is); ``which`` is neither.

        Example::

            text = fragment.bind({p.name: f"args.{p.name}" for p in fragment.placeholders})
        """
        texts = {"epilogue": self.epilogue_arguments, "fusion": self.fusion_arguments}
        if which not in texts:
            raise FragmentError(f"bind(which={which!r}): 'epilogue' or 'fusion'", epilogue=self.epilogue)
        if values is not None and not isinstance(values, Mapping):
            raise FragmentError(f"bind({values!r:.60}): give the placeholders' values as a dict of placeholder name "
                                "-> C++ expression (or as keywords)", epilogue=self.epilogue,
                                hint=f"its placeholders: {', '.join(p.name for p in self.placeholders)}")
        given: dict[str, str] = {}
        for source in (values or {}), more:
            for k, v in source.items():
                if k in given:
                    raise FragmentError(f"placeholder '{k}' is bound twice", epilogue=self.epilogue)
                if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                    raise FragmentError(f"placeholder '{k}' = {v!r}: give a C++ expression as a string",
                                        epilogue=self.epilogue)
                why = _not_one_expression(str(v))
                if why:
                    raise FragmentError(f"placeholder '{k}' = {str(v)!r:.80}: {why}", epilogue=self.epilogue,
                                        hint="bind each placeholder to one C++ expression, e.g. 'params.bias_ptr' "
                                             "or '1.0f' (a template argument list with a comma: wrap the "
                                             "expression in parentheses; docs/plugin.md, 'Binding the arguments')")
                given[k] = str(v)
        text = texts[which]
        needed = set(_PLACEHOLDER.findall(text))
        missing = sorted(needed - set(given))
        known = {p.name for p in self.placeholders}
        unknown = sorted(set(given) - known)
        if unknown:
            raise FragmentError(f"fragment {self.qualified_name} has no placeholder{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(unknown)}", epilogue=self.epilogue,
                                hint=f"its placeholders: {', '.join(p.name for p in self.placeholders)}")
        if missing:
            raise FragmentError(f"placeholder{'s' if len(missing) > 1 else ''} {', '.join(missing)} of fragment "
                                f"{self.qualified_name} {'are' if len(missing) > 1 else 'is'} not bound",
                                epilogue=self.epilogue,
                                hint="bind every name in fragment.placeholders (docs/plugin.md, 'Binding the arguments')")
        return string.Template(text).substitute({k: v for k, v in given.items() if k in needed})

    # ---- validation ---------------------------------------------------------------------------------

    def check(self, *, tile: Any = None, schedule: str | None = None, cluster: Any = None,
              epilogue_tile: Any = None, a: Any = None, b: Any = None, c: Any = None, d: Any = None,
              stages: int | None = None, version: int | None = None) -> None:
        """Check that a kernel with these properties can use this fragment. Arguments left None
        are not checked.

        Args:
            tile: the kernel's CTA tile (M, N, K); must be :attr:`tile`.
            schedule: ``cooperative`` or ``pingpong`` (or a CUTLASS kernel schedule type name
                such as ``cutlass::gemm::KernelTmaWarpSpecializedCooperative``); must be
                :attr:`schedule`.
            cluster: the kernel's cluster (M, N, 1) or (M, N): any legal sm90 cluster.
            epilogue_tile: the epilogue subtile (M, N) the kernel's collective uses; must be
                :attr:`epilogue_tile`.
            a, b: the mainloop operand dtypes (evtc dtypes or names); must be :attr:`a`/:attr:`b`.
            c, d: the element types of the kernel's C and D (dtypes, names, or ``"void"``); must
                be those of :attr:`c_input` and :attr:`d_output`.
            stages: mainloop stages the kernel uses (``StageCount<stages>``); must fit beside
                :attr:`smem_bytes` in :attr:`smem_capacity`.
            version: the fragment version the consumer was written for; must be
                :attr:`version`.

        Raises:
            FragmentError: the first property that does not match, naming it, the value the
                fragment allows and how to get a fragment that allows the asked one.
        """
        who = f"fragment {self.qualified_name}"
        relower = "lower the epilogue again with evtc.plugin.lower(..., {}={!r})"

        def fail(msg: str, hint: str) -> None:
            raise FragmentError(f"{who}: {msg}", epilogue=self.epilogue, hint=hint)

        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            fail(f"version={version!r}: a fragment version is an integer", f"e.g. version={self.version}")
        if version is not None and version != self.version:
            fail(f"the consumer was written for fragment version {version}, the fragment is version {self.version}",
                 "regenerate the fragment with an evtc that makes that version, or update the consumer "
                 "(docs/plugin.md, 'Versioning')")
        if tile is not None:
            asked = _tuple3(tile)
            if asked != self.tile:
                fail(f"tile {asked} is not the tile it was planned for, {self.tile}: its buffers, row broadcasts "
                     "and epilogue tile are sized for that tile", relower.format("tile", asked))
        if schedule is not None:
            sched = _schedule_name(schedule)
            if sched != self.schedule:
                fail(f"schedule {schedule!r} is not the schedule it was planned for, '{self.schedule}' (the "
                     "epilogue tile's M and the threads per epilogue differ)", relower.format("schedule", sched))
        if epilogue_tile is not None:
            asked = _tuple3(epilogue_tile)
            if asked != self.epilogue_tile:
                fail(f"epilogue tile {asked} is not the planned {self.epilogue_tile}",
                     "use the fragment's EpilogueTile, or " + relower.format("epilogue_tile", asked))
        if cluster is not None:
            self._check_cluster(cluster, fail)
        for arg, value, want in (("a", a, self.a), ("b", b, self.b)):
            if value is not None:
                got = _dtype_name(value, arg, self.epilogue, who)
                if got != want:
                    fail(f"{arg}={got}: it was planned for {arg}={want} (the operand type sizes the mainloop stages "
                         "left beside the epilogue)", relower.format(arg, got))
        slots = (("c", c, self.c_input, self.element_c), ("d", d, self.d_output, self.element_d))
        for arg, value, tensor, element in slots:
            if value is None:
                continue
            got = "void" if value == "void" else _dtype_name(value, arg, self.epilogue, who)
            want = "void" if tensor is None else self.parameter(tensor).dtype
            if got != want:
                where = f"its {arg.upper()} slot holds {tensor} ({want})" if tensor else f"it has no {arg.upper()} slot"
                fail(f"{arg}={got}: {where}", f"declare Element{arg.upper()} as {element}")
        if stages is not None:
            self._check_stages(stages, fail)

    def _check_cluster(self, cluster: Any, fail: Callable[[str, str], None]) -> None:
        """:meth:`check` of ``cluster``: any cluster sm90's rules allow with this tile."""
        from evtc import dtypes
        from evtc.plan.config import GemmConfig, validate

        cl = _tuple3(cluster)
        if isinstance(cl, tuple) and len(cl) == 2:
            cl = (*cl, 1)
        try:
            validate(GemmConfig(tile=self.tile, cluster=cl, schedule=self.schedule), self.arch,
                     dtypes.coerce(self.a), dtypes.coerce(self.b))
        except EvtcError as e:
            msg = e.message
            fail(f"cluster {cluster!r} is not a legal sm90 cluster ({msg})",
                 "use a cluster of 1, 2 or 4 CTAs along M and N, at most 4 in all")

    def _check_stages(self, stages: Any, fail: Callable[[str, str], None]) -> None:
        """:meth:`check` of ``stages``: they fit beside the epilogue's shared memory."""
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 2:
            fail(f"stages={stages!r}: the TMA mainloop needs an integer >= 2", "pass stages >= 2, or None")
        from evtc.plan.smem import round_up

        used = round_up(self.smem_bytes, 128) + stages * self.mainloop_stage_bytes
        if used > self.smem_capacity // 128 * 128:
            fail(f"{stages} mainloop stages of {self.mainloop_stage_bytes} B do not fit beside the epilogue's "
                 f"{self.smem_bytes} B in {self.smem_capacity} B (at most {self.mainloop_stages})",
                 f"use at most {self.mainloop_stages} stages, or StageCountAutoCarveout")

    # ---- serialisation ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        """Every contract field as a JSON-serialisable dict (no plan, graph or machine paths)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("plan", "graph", "preamble"):
                continue
            v = getattr(self, f.name)
            if f.name in ("placeholders", "parameters"):
                v = [x.to_json() for x in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


_SCHEDULE_TYPES = {
    "cooperative": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                    "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum",
                    "cutlass::epilogue::TmaWarpSpecializedCooperative"),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong",
                 "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum",
                 "cutlass::epilogue::TmaWarpSpecialized"),
}


def _schedule_name(schedule: Any) -> str:
    """``cooperative``/``pingpong`` from either name or a CUTLASS schedule type's name."""
    s = str(schedule).strip()
    for name, types in _SCHEDULE_TYPES.items():
        if s == name or s in types or s.lstrip(":") in types:
            return name
    return s


def _dtype_name(value: Any, arg: str, epilogue: str, who: str) -> str:
    from evtc import dtypes
    from evtc.errors import UnknownDTypeError

    try:
        return dtypes.coerce(value).name
    except UnknownDTypeError as e:
        raise FragmentError(f"{who}: check({arg}={value!r}): {e.message}", epilogue=epilogue, hint=e.hint) from None
