"""Grouped GEMMs with any fused epilogue: a mixture-of-experts layer in one launch.

:class:`GroupedGemm` runs E GEMMs that share N and K, each with its own M (the tokens routed to
one expert), and evtc's epilogue on every one of them, in torch's ``torch._grouped_mm``
convention: ``A`` (T, K) with each group's rows contiguous and the groups in order, ``B``
(E, N, K) (each expert's weight as ``nn.Linear`` keeps it), ``offs`` (E,) int32 cumulative row
counts (group e has rows ``[offs[e-1], offs[e])``, ``offs[-1] = 0``), D (T, N).

# NOTE [The grouped kernel]
CUTLASS's pointer-array kernel (``KernelPtrArrayTmaWarpSpecializedCooperative`` / ``...Pingpong``
over a ``GroupProblemShape``: gemm/kernel/sm90_gemm_array_tma_warpspecialized_*.hpp) takes, per
group, a problem shape and A/B/C/D pointers and strides, in device arrays; its persistent group
scheduler walks the tiles of every group and each CTA rewrites its TMA descriptors in place when
its next tile is in another group (``tensormaps_perform_update``). evtc fills those arrays on the
device: a setup kernel, one thread per group, launched on the caller's stream before the GEMM,
reads ``offs`` and writes the group table (codegen_templates/sm90/grouped.cu.j2). So the host
never reads the offsets (no synchronisation; a CUDA graph captures the pair) and needs only
what the tensors' shapes say: T, E, N, K, which also choose the family member
(:func:`choose_member`). Out-of-range offsets are clamped on the device (never an access outside
the tensors); ``check_offs=True`` checks them on the host (one synchronisation).

The epilogue is planned once for all groups (the same shared memory for every group, with the
collective's tensor maps: :func:`evtc.plan.sm90_layout.shared_storage`). What can change per
group, and how (:func:`check_grouped_graph` refuses the rest before anything is built):

* ``C`` (or the first ``evtc.Matrix`` input): the collective's source, a (T, N) tensor in the
  token layout, one pointer per group (e.g. the gate's output for SwiGLU's ``silu(gate) * acc``);
  D (or the first output): the collective's destination, likewise;
* other M x N inputs and outputs (aux loads and stores, e.g. a training forward's saved
  pre-activation): register-direct, per-thread vector accesses predicated by the group's M,
  through a per-group pointer (``evtc::Sm90AuxLoadGrouped`` / ``Sm90AuxStoreGrouped``,
  include/evtc/sm90_grouped.hpp: CUTLASS's register-direct visitors with the group's tensor);
* row vectors ``bias[e, n]`` (E, N), or (N,) shared by all groups: ``Sm90RowBroadcast`` over an
  array of per-group pointers (its ``IsArrayOfPointers`` form);
* column vectors ``w[token]`` (T,): ``Sm90ColBroadcast`` over per-group pointers (a group's
  first token on), one element per load since a group may start anywhere;
* scalars by value (one for all), or by pointer: a (E,) tensor gives one per group
  (``Sm90ScalarBroadcast`` indexes its pointer by the group, the kernel's L coordinate).

* reductions, f32, through atomics into outputs evtc fills with the identity first (NOTE
  [Reductions in the grouped kernel], include/evtc/sm90_grouped.hpp): a row reduction is one
  value per token (T,), a column reduction one row per group (E, N), a scalar reduction one value
  per group (E,) (an fp8 amax per expert). CUTLASS's reduction visitors take one pointer and a
  batch stride, and their workspace is laid out by uniform tiles, not the group scheduler's, so
  evtc's own visitor reduces each subtile and adds it atomically; sums are therefore not
  bitwise reproducible run to run (max and min are).

Not in the grouped kernel (yet): ``evtc.quantize``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from typing import Any, Mapping

import numpy as np

from evtc import dtypes, knobs
from evtc.abi import ctypes_struct, grouped_abi_fields
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.runtime.grouped_args import bind_input, check_matrix, check_operands, check_overlaps, checked_offs
from evtc.emit.sm90_grouped import reduction_shape
from evtc.errors import ArgumentError, ConfigError, PlanError, api_boundary
from evtc.family.spec import KernelSpec
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.ir import nodes as ir_nodes
from evtc.pipeline import Kernel, Pipeline
from evtc.plan import GemmConfig
from evtc.plan.config import RASTER_ORDERS, check_mainloop_dtypes
from evtc.plan.config import validate as validate_config
from evtc.torch.fast import torch_compiling

__all__ = ["GROUPED_MEMBERS", "GroupedGemm", "check_grouped_graph", "choose_member", "reduction_shape"]

#: The grouped family: (schedule, tile), one cluster CTA each. ``pp64x128``: the ping-pong
#: schedule's 64-row tile for groups of a few tokens (decode: most experts hold 0-4 tokens, and a
#: 128-row tile would compute 124 padding rows); ``coop128x128``: prefill-sized groups;
#: ``coop128x256``: large groups and wide N. Tiles K = 64 (one 128-byte swizzle row of bf16).
GROUPED_MEMBERS: dict[str, GemmConfig] = {
    "pp64x128": GemmConfig(tile=(64, 128, 64), cluster=(1, 1, 1), schedule="pingpong", grouped=True),
    "coop128x128": GemmConfig(tile=(128, 128, 64), cluster=(1, 1, 1), schedule="cooperative", grouped=True),
    "coop128x256": GemmConfig(tile=(128, 256, 64), cluster=(1, 1, 1), schedule="cooperative", grouped=True),
}


def choose_member(tokens: int, groups: int, n: int) -> str:
    """The family member for T ``tokens`` over E ``groups`` and N ``n``, from the host's
    shapes only (the offsets stay on the device): the mean group size picks the tile.

    NOTE [The grouped family's rule]: 64-row ping-pong tiles while the mean group holds at most
    64 tokens (a 128-row tile would be mostly padding), else 128 x 256 cooperative tiles (fewer
    tiles, and the large groups of skewed routing dominate). Measured on the H200 (2026-11-28,
    bench_moe.py --members, docs/performance.md "Grouped GEMMs"): over the 30 rows' 60 grouped
    GEMMs (three MoE models, 1-16384 tokens, balanced and Zipf routing) the chosen member took
    1.008x the best member's time (geomean), at most 1.079x; the first rule (128 x 128 tiles
    between) took 1.033x, at most 1.33x (DeepSeek-V3 at 16384 Zipf-routed tokens). Fitted on
    those rows: no held-out set yet. ``n`` is kept for a rule that needs it."""
    del n
    return "pp64x128" if tokens <= 64 * max(groups, 1) else "coop128x256"


#: the input kinds the grouped kernel takes per group (module docstring)
_PER_GROUP_LEAVES = (ir_nodes.Accumulator, ir_nodes.Source, ir_nodes.AuxLoad, ir_nodes.RowBroadcast,
                     ir_nodes.ColBroadcast, ir_nodes.ScalarBroadcast)


def check_grouped_graph(graph: Graph) -> tuple[str | None, str, list[str]]:
    """Check that the grouped kernel can run ``graph``'s epilogue.

    Returns:
        (the M x N input that is the collective's C, or None; the output that is its D, None for
        ``evtc.glu``'s, whose plan has void C and D; the other M x N inputs and outputs, which go
        register-direct through the group table: ``evtc::Sm90AuxLoadGrouped`` /
        ``Sm90AuxStoreGrouped`` / ``Sm90GluStoreGrouped``, include/evtc/sm90_grouped.hpp and
        sm90_glu_store.hpp).

    Raises:
        PlanError: naming a reduction (the grouped kernel has no per-group reductions yet), an
            input with no per-group form, or an epilogue without an M x N output.
    """
    mn_inputs = [leaf.name for leaf in graph.used_inputs if isinstance(leaf, (ir_nodes.Source, ir_nodes.AuxLoad))]
    for leaf in graph.used_inputs:
        if not isinstance(leaf, _PER_GROUP_LEAVES):
            raise PlanError(f"input '{leaf.name}' ({type(leaf).__name__}) has no per-group form in the grouped kernel",
                            epilogue=graph.name)
    for out in graph.outputs:
        if isinstance(out, ir_nodes.GroupScale):
            raise PlanError(f"output '{out.name}': the grouped kernel does not quantize (evtc.quantize) yet",
                            epilogue=graph.name, hint="quantize the grouped GEMM's output after it, or run evtc.Gemm "
                            "per group")
        if isinstance(out, ir_nodes.Reduction) and out.dtype is not dtypes.f32:
            raise PlanError(f"output '{out.name}': the grouped kernel reduces into f32 (float atomics: NOTE "
                            f"[Reductions in the grouped kernel]), not {out.dtype.name}", epilogue=graph.name,
                            hint="drop the .to(...) on the reduction and convert it afterwards")
    stores = [o.name for o in graph.outputs if isinstance(o, ir_nodes.Store)]
    if not stores:
        raise PlanError("the grouped kernel stores at least one M x N output", epilogue=graph.name)
    if any(ir_nodes.is_gated(o) for o in graph.outputs):  # evtc.glu: void C and D, all through the table
        return None, None, mn_inputs + stores
    d = "D" if "D" in stores else stores[0]
    c = next((n for n in mn_inputs if isinstance(graph.input(n), ir_nodes.Source)), mn_inputs[0] if mn_inputs else None)
    direct = [n for n in mn_inputs if n != c] + [n for n in stores if n != d]
    return c, d, direct


#: prepared problems kept per member before the cache starts over (T changes with every batch)
MAX_PREPARED = 1024


def _stream(device: int) -> int:
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else int(torch.cuda.current_stream(device).cuda_stream)


@dataclasses.dataclass
class _Member:
    """One family member's kernel and its launch state (NOTE [The launch path] in
    evtc/runtime/launch.py: ``evtc_prepare`` once per problem signature, then ``evtc_launch`` with
    the call's pointers and scalars packed into one ``evtc_call_t``)."""

    spec: KernelSpec
    kernel: Kernel
    table_bytes: Any = None  # the library's evtc_group_table_bytes, once loaded
    prepared: dict = dataclasses.field(default_factory=dict)  # signature -> (handle, workspace bytes)

    def table_size(self, groups: int) -> int:
        return int(self.table_bytes(groups))

    def launch(self, args, device: int, stream: int, epilogue: str) -> None:
        """Launch ``args`` (every field set) on ``stream``: prepared once per signature (every
        field but the pointers and by-value scalars), the workspace from torch's allocator."""
        import torch

        lib = self.kernel.library
        layout = lib.call_layout
        key = (device,) + tuple(getattr(args, f.name) for f in lib.fields if f.what not in ("ptr", "value"))
        for attempt in (0, 1):
            got = self.prepared.get(key)
            if got is None:
                if len(self.prepared) >= MAX_PREPARED:
                    self.prepared.clear()
                got = self.prepared[key] = lib.prepare(args, device, epilogue)
            handle, ws_bytes = got
            ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=torch.device("cuda", device))
            buf = ctypes.create_string_buffer(layout.size)
            layout.packer.pack_into(buf, 0, handle, ws.data_ptr(), ws_bytes, stream,
                                    *[getattr(args, n) or 0 for n in layout.pointers],
                                    *[getattr(args, n) for n in layout.scalars])
            status = lib.lib.evtc_launch(buf)
            if status == 6 and attempt == 0:  # stale: a pointer's alignment class changed
                self.prepared.pop(key, None)
                continue
            if status:
                lib.raise_status(status, epilogue)
            return


class GroupedGemm:
    """A grouped GEMM with a fused epilogue on sm90: ``D[rows of e] = epilogue(A[rows of e] @ B[e]^T, ...)``
    for every group e, in one launch.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or an expression string; its inputs
            may be the accumulator, M x N inputs (``C``, ``evtc.Matrix``), row vectors, column
            vectors and scalars, and it returns M x N tensors, no reductions (see the module's
            NOTE [The grouped kernel] for what varies per group).
        a: A's dtype (bf16, f16; e4m3 with an e4m3 B).
        b: B's dtype (default: A's).
        c: the M x N inputs' dtype (default: the epilogue's).
        d: D's dtype (default: the epilogue's, else bf16).
        member: pin one of :data:`GROUPED_MEMBERS` (default: :func:`choose_member` per call).
        config: a GemmConfig (or dict) to run instead of the family; ``grouped`` is set.
        batch_invariant: as :class:`evtc.Gemm`'s: a row's bits must not depend on how many
            tokens the call has or which member runs it. The grouped family is so by
            construction (NOTE [Batch invariance] in :mod:`evtc.dispatch.invariance`): its
            members share tile K and none splits K, runs stream-K or swaps A and B (the grouped
            kernel has none of these), and it has no reductions. The flag is checked against
            that (``gemm.batch_invariant`` holds it); None: ``EVTC_BATCH_INVARIANT``.

    Raises:
        PlanError: the epilogue has a part the grouped kernel can't run per group
            (:func:`check_grouped_graph`), or no plan fits.
        ConfigError: a bad ``member`` or ``config``; dtypes the mainloop doesn't take; a
            ``batch_invariant`` that is not True, False or None.
    """

    arch = "sm90"

    @api_boundary
    def __init__(self, epilogue: Epilogue | Graph | str, *, a: DType | str = dtypes.bf16, b: DType | str | None = None,
                 c: DType | str | None = None, d: DType | str | None = None, member: str | None = None,
                 config: GemmConfig | Mapping | None = None, batch_invariant: bool | None = None) -> None:
        from evtc.gemm import _check_flag

        _check_flag("batch_invariant", batch_invariant, getattr(epilogue, "name", "grouped"))
        self.a = dtypes.coerce(a, "a")
        self.b = dtypes.coerce(b, "b") if b is not None else self.a
        self.c = dtypes.coerce(c, "c") if c is not None else None
        self.d = dtypes.coerce(d, "d") if d is not None else getattr(epilogue, "default_d", dtypes.bf16)
        check_mainloop_dtypes(self.arch, self.a, self.b)
        if member is not None and (not isinstance(member, str) or member not in GROUPED_MEMBERS):
            raise ConfigError(f"member {member!r} is not one of the grouped family's {sorted(GROUPED_MEMBERS)}",
                              hint="pass one of their names, or leave member out (chosen per call)")
        self.pipeline = Pipeline(epilogue, a=self.a, b=self.b, c=self.c, d=self.d)
        self.name = self.pipeline.name
        self.graph = self.pipeline.graph_for(self.arch)
        self.c_input, self.d_output, direct = check_grouped_graph(self.graph)
        if config is not None:
            if isinstance(config, Mapping):
                config = GemmConfig.from_json(dict(config))
            if not isinstance(config, GemmConfig):
                raise ConfigError(f"config = {config!r} is not a GemmConfig", epilogue=self.name,
                                  hint="pass evtc.GemmConfig(...) or a dict of its fields")
            configs = {"custom": config.replace(grouped=True)}
            member = "custom"
        else:
            configs = GROUPED_MEMBERS
        # the collective's C and D, every other M x N tensor register-direct through the group
        # table, rows through shared memory (the pointer-array form of Sm90RowBroadcast)
        fixed: dict[str, Any] = {"direct": direct, "d_slot": self.d_output}
        if self.c_input is not None:
            fixed["c_slot"] = self.c_input
        if self.d_output is None:  # evtc.glu: one plan (void C and D), its M x N tensors direct
            fixed = {}
        self.member = member
        self._members: dict[str, _Member] = {}
        for name, cfg in configs.items():
            cfg = validate_config(cfg, self.arch, self.a, self.b)
            spec = KernelSpec(name, cfg, self.arch)
            self._members[name] = _Member(spec, self.pipeline.kernel(spec, fixed=fixed))
        self.batch_invariant = knobs.batch_invariant.get() if batch_invariant is None else bool(batch_invariant)
        if self.batch_invariant:  # invariant by construction (the docstring's batch_invariant): checked, not assumed
            orders = {(m.spec.config.tile[2], m.spec.config.split_k, m.spec.config.swap_ab)
                      for m in self._members.values()}
            if len(orders) != 1 or next(iter(orders))[1:] != (1, False):
                raise ConfigError(f"batch_invariant=True: the grouped members' K orders differ ({sorted(orders)})",
                                  epilogue=self.name, hint="pin one member (member=...) or pass batch_invariant=False")
        self.fields = grouped_abi_fields(self.graph)
        self._Args = ctypes_struct(self.fields)  # evtc_args_t's layout, known before any build
        self._torch_op = self._torch_op_error = None
        if "torch" in sys.modules:  # NOTE [The torch op is made outside torch.compile] (evtc/torch/ops.py)
            from evtc.torch.grouped_op import grouped_torch_op

            try:
                self._torch_op = grouped_torch_op(self)
            except ArgumentError as e:
                self._torch_op_error = e

    def torch_op(self):
        """The GroupedGemm's ``torch.library`` op (:mod:`evtc.torch.grouped_op`), made on first use.

        Raises:
            ArgumentError: a parameter name the op schema can't hold.
        """
        if self._torch_op is None:
            from evtc.torch.grouped_op import grouped_torch_op

            self._torch_op = grouped_torch_op(self)
        return self._torch_op

    # ---- introspection and builds ------------------------------------------------------------------

    @property
    def members(self) -> tuple[str, ...]:
        """The family's member names."""
        return tuple(self._members)

    def _member(self, name: Any) -> _Member:
        """The member called ``name``.

        Raises:
            ConfigError: no member has that name.
        """
        if not isinstance(name, str) or name not in self._members:
            raise ConfigError(f"member {name!r} is not one of this GroupedGemm's {list(self._members)}",
                              epilogue=self.name, hint="pass one of their names")
        return self._members[name]

    def kernel(self, member: str | None = None) -> Kernel:
        """The :class:`~evtc.pipeline.Kernel` of ``member`` (default: the pinned or the first)."""
        return self._member(member or self.member or next(iter(self._members))).kernel

    def source(self, member: str | None = None) -> str:
        """The ``.cu`` text of ``member``'s kernel."""
        return self.kernel(member).source

    def jobs(self) -> list[cache.BuildJob]:
        """The build jobs of the pinned member, else of every member (for
        :func:`evtc.compiler.build_many` and benchmarks/prebuild.py)."""
        names = [self.member] if self.member else list(self._members)
        return [self._members[n].kernel.job() for n in names]

    @api_boundary
    def build(self, members: tuple[str, ...] | list[str] | None = None, *, timeout: float | None = None) -> None:
        """Compile (or fetch from the cache) and load ``members`` (default: the pinned member,
        else all), in parallel.

        Raises:
            BuildError: nvcc failed.
        """
        if isinstance(members, str):  # one member's name, not its letters
            members = [members]
        names = list(members) if members else ([self.member] if self.member else list(self._members))
        todo = [m for m in map(self._member, names) if m.kernel.library is None]
        results = cache.build_many([m.kernel.job() for m in todo], timeout=timeout)
        for m, art in zip(todo, results):
            if isinstance(art, Exception):
                raise art
            m.kernel.load(art)

    def _loaded(self, name: str) -> _Member:
        m = self._members[name]
        if m.kernel.library is None:
            self.build([name])
        if m.table_bytes is None:
            fn = m.kernel.library.lib.evtc_group_table_bytes
            fn.restype, fn.argtypes = ctypes.c_size_t, [ctypes.c_int]
            m.table_bytes = fn
        return m

    # ---- calls -------------------------------------------------------------------------------------

    def __call__(self, A, B, offs, *, out=None, member: str | None = None, check_offs: bool = False, **inputs):
        """Run the grouped GEMM and its epilogue.

        Args:
            A: (T, K) torch tensor of dtype ``a`` on a CUDA device; rows of group e are
                ``[offs[e-1], offs[e])``; row stride a multiple of 16 bytes, unit column stride.
            B: (E, N, K) tensor of dtype ``b``: group e's weight ``B[e]`` (N x K, K contiguous).
            offs: (E,) int32 tensor on A's device: cumulative row counts, non-decreasing, at
                most T (an empty group repeats the previous offset).
            out: optional (T, N) tensor for D (dtype ``d``, rows of 16 bytes; (T, N / 2) for
                ``evtc.glu``'s), or a dict of some of the M x N outputs by name (with several
                outputs, or reductions beside D: the result is a dict too). Reductions are
                always evtc's own (it fills them with the identity before the launch).
            member: run this family member instead of the chosen one.
            check_offs: check ``offs`` on the host first (one synchronisation); otherwise
                offsets outside [0, T] or decreasing are clamped on the device.
            **inputs: the epilogue's inputs by name: the M x N input (T, N); row vectors (E, N)
                or (N,); column vectors (T,); scalars as numbers, or (by pointer) 0-d, (1,) or
                (E,) tensors of their dtype.

        Returns:
            D, a (T, N) tensor of dtype ``d`` (several outputs, or reductions: a dict by name; a
            row reduction is (T,), a column reduction (E, N), a scalar reduction (E,), f32). Inside a
            ``torch.compile``-d function (no ``out=``, ``member=`` or ``check_offs=``) the call
            goes through the GroupedGemm's torch op (:mod:`evtc.torch.grouped_op`).

        Raises:
            ArgumentError: a tensor of the wrong shape, dtype, device or stride; a missing or
                unknown input; offsets out of range (with ``check_offs``).
            LaunchError: the kernel failed to launch.
        """
        if out is None and member is None and not check_offs and torch_compiling():
            if self._torch_op is None:  # Dynamo can't make the op while it traces
                raise self._torch_op_error or ArgumentError(
                    f"evtc: the GroupedGemm '{self.name}' was made before torch was imported, so it has no torch "
                    "op", epilogue=self.name, hint="call gg.torch_op() once before compiling")
            return self._torch_op(A, B, offs, **inputs)
        return self.run_eager(A, B, offs, out=out, member=member, check_offs=check_offs, **inputs)

    @api_boundary
    def run_eager(self, A, B, offs, *, out=None, member: str | None = None, check_offs: bool = False, **inputs):
        """:meth:`__call__` without the torch op (what the op runs).

        Raises:
            ArgumentError: :meth:`__call__`'s, and ``member`` not a member's name or None,
                ``check_offs`` not a bool (checked first).
        """
        import torch

        name = self.name
        if member is not None and not isinstance(member, str):
            raise ArgumentError(f"member={member!r}: the name of a member, one of {self.members}, or None",
                                epilogue=name)
        if not isinstance(check_offs, (bool, np.bool_)):  # (bool("no") is True)
            raise ArgumentError(f"check_offs={check_offs!r}: True or False", epilogue=name)
        A_, B_ = check_operands(A, B, self.a, self.b, name)
        T, K = A_.shape
        E, N, _ = B_.shape
        device = A_.device
        offs = checked_offs(offs, E, T, device, check_offs, name)
        if N % 8 or K % 8:
            raise ArgumentError(f"N = {N}, K = {K}: the grouped kernel's TMA rows need N and K multiples of 8",
                                epilogue=name, hint="pad N and K to multiples of 8 elements")
        chosen = member or self.member or choose_member(T, E, N)
        if chosen not in self._members:
            raise ArgumentError(f"member '{chosen}' is not one of {self.members}", epilogue=name)
        args = self._Args()
        args.M, args.N, args.K, args.L = T, N, K, E
        cfg = self._members[chosen].spec.config
        args.max_swizzle_size = 1 << (cfg.swizzle or 0)
        # the group scheduler applies no heuristic (sm90_tile_scheduler_group.hpp): its default, along M
        args.raster_order = RASTER_ORDERS.index("along_m" if cfg.raster == "heuristic" else cfg.raster)
        args.p_A, args.ld_A, args.bs_A = A_.data_ptr(), A_.stride(0), 0
        args.p_B, args.ld_B, args.bs_B = B_.data_ptr(), B_.stride(1), B_.stride(0)
        keep = [A_, B_, offs]
        unknown = set(inputs) - {leaf.name for leaf in self.graph.inputs}
        if unknown:
            raise ArgumentError(f"unknown input(s) {sorted(unknown)}", epilogue=name,
                                hint=f"the epilogue takes {[leaf.name for leaf in self.graph.used_inputs]}")
        for leaf in self.graph.used_inputs:
            if isinstance(leaf, ir_nodes.Accumulator):
                continue
            if leaf.name not in inputs:
                raise ArgumentError(f"input '{leaf.name}' is missing", epilogue=name)
            keep.append(bind_input(args, leaf, inputs[leaf.name], T, N, E, device, name))
        # what a given output must not overlap: (name, tensor, an M x N input it may be exactly)
        read = [("A", A_, False), ("B", B_, False), ("offs", offs, False)] + [
            (leaf.name, inputs[leaf.name], isinstance(leaf, (ir_nodes.Source, ir_nodes.AuxLoad)))
            for leaf in self.graph.used_inputs if leaf.name in inputs and isinstance(inputs[leaf.name], torch.Tensor)]
        stores = [o for o in self.graph.outputs if isinstance(o, ir_nodes.Store)]
        single = len(stores) == 1
        # a dict by output name whenever the result is one (several stores, or reductions beside
        # one store); a bare tensor for a lone store
        given = dict(out) if isinstance(out, Mapping) else {stores[0].name: out} if single else dict(out or {})
        unknown_out = set(given) - {o.name for o in stores}
        reduced = sorted(unknown_out & {o.name for o in self.graph.outputs})
        if reduced:
            raise ArgumentError(f"out= holds the reduction(s) {reduced}: evtc allocates a grouped kernel's "
                                "reductions (filled with the identity before the atomics)", epilogue=name,
                                hint=f"pass only M x N outputs in out=: {[o.name for o in stores]}")
        if unknown_out:
            raise ArgumentError(f"out= names {sorted(unknown_out)}, which the epilogue does not return", epilogue=name,
                                hint=f"its outputs: {[o.name for o in stores]}")
        outs = {}
        for o in stores:
            t = given.get(o.name)
            cols = o.columns(N)  # N, or N / 2 for evtc.glu's output
            if t is None:
                t = torch.empty((T, cols), dtype=getattr(torch, o.dtype.torch), device=device)
            else:
                label = "out" if single and not isinstance(out, Mapping) else f"out['{o.name}']"
                check_matrix(t, label, o.dtype, T, cols, device, name)
                check_overlaps(label, t, read, name)
                read.append((label, t, False))
            setattr(args, f"p_{o.name}", t.data_ptr())
            setattr(args, f"ld_{o.name}", t.stride(0))
            setattr(args, f"bs_{o.name}", 0)
            outs[o.name] = t
        reductions = [o for o in self.graph.outputs if isinstance(o, ir_nodes.Reduction)]
        for o in reductions:  # NOTE [Reductions in the grouped kernel]: atomics into the identity
            t = torch.full(reduction_shape(o, T, E, N), o.op.identity, dtype=torch.float32, device=device)
            setattr(args, f"p_{o.name}", t.data_ptr())
            setattr(args, f"bs_{o.name}", N if o.dim == 0 else 1 if o.dim is None else 0)
            outs[o.name] = t
        single = single and not reductions
        result = outs[stores[0].name] if single else outs
        if T == 0 or E == 0 or N == 0:  # nothing to compute (reductions hold their identity)
            return result
        m = self._loaded(chosen)  # every check above ran before any build
        dev = device.index if device.index is not None else torch.cuda.current_device()
        table = torch.empty(m.table_size(E), dtype=torch.uint8, device=device)
        args.p_offs, args.p_groups = offs.data_ptr(), table.data_ptr()
        m.launch(args, dev, _stream(dev), name)
        return result

    def run_list(self, As, Bs, **inputs) -> list:
        """The list-of-problems form: ``D_e = epilogue(As[e] @ Bs[e]^T, ...)`` for every group e.

        The groups are packed into the token layout (``torch.cat``) and run as one grouped call,
        then D is split back: convenient where the groups come as separate tensors, at the cost
        of the copies (a caller that already holds the packed layout calls the GroupedGemm).

        Args:
            As: E tensors (m_e, K) (m_e may be 0). Bs: E tensors (N, K), or one (E, N, K).
            **inputs: as for a call, with every M x N input and column vector given as a list
                of E per-group tensors ((m_e, N) and (m_e,)); row vectors, scalars as for a call.

        Returns:
            A list of E tensors (m_e, N) (dicts of them by output name, with several outputs or
            reductions: group e's rows of a row reduction (m_e,), its column reduction (N,), its
            scalar reduction (a 0-d tensor)); (m_e, N / 2) for ``evtc.glu``'s output.

        Raises:
            ArgumentError: lists of different lengths, or as for a call.
        """
        import torch

        def tensors(what: str, ts: Any, dim: int) -> list:
            """``ts`` as a list of ``dim``-D torch tensors that torch.cat / torch.stack can pack
            (one trailing shape, dtype and device), or an ArgumentError naming ``what``."""
            if not isinstance(ts, (list, tuple)):
                raise ArgumentError(f"{what} is a {type(ts).__name__}: run_list takes a list of per-group tensors",
                                    epilogue=self.name, hint="pass a list, one tensor per group")
            ts = list(ts)
            for e, t in enumerate(ts):
                if not isinstance(t, torch.Tensor) or t.dim() != dim:
                    got = f"{tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
                    raise ArgumentError(f"{what}[{e}] is {got}: a {dim}-D torch tensor is expected", epilogue=self.name)
            kinds = {(tuple(t.shape[1:]) if dim > 1 else (), t.dtype, t.device) for t in ts}
            if len(kinds) > 1:
                raise ArgumentError(f"{what} differ in {'their trailing shape, ' if dim > 1 else ''}dtype or device "
                                    f"({sorted(map(str, kinds))}): they are packed into one tensor", epilogue=self.name)
            return ts

        As = tensors("As", As, 2)
        E = len(As)
        if isinstance(Bs, (list, tuple)):
            if len(Bs) != E:
                raise ArgumentError(f"{E} A tensors and {len(Bs)} B tensors: one of each per group", epilogue=self.name)
            Bs = tensors("Bs", Bs, 2)
            if any(b.shape != Bs[0].shape for b in Bs):
                raise ArgumentError(f"Bs have the shapes {[tuple(b.shape) for b in Bs]}: every group's B is (N, K)",
                                    epilogue=self.name)
            Bs = torch.stack(Bs) if E else None
        if E == 0:
            return []
        sizes = [int(a.shape[0]) for a in As]
        offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32).to(As[0].device)
        packed = {}
        for name, value in inputs.items():
            if isinstance(value, (list, tuple)):
                if len(value) != E:
                    raise ArgumentError(f"input '{name}' has {len(value)} per-group tensors for {E} groups",
                                        epilogue=self.name)
                value = tensors(f"input '{name}'", value, value[0].dim() if isinstance(value[0], torch.Tensor) else 2)
                packed[name] = torch.cat(value)
            else:
                packed[name] = value
        got = self(torch.cat(As), Bs, offs, **packed)
        if isinstance(got, dict):
            # (a column reduction (E, N) and a scalar one (E,) have a row per group, not per token)
            per_group = {o.name for o in self.graph.outputs if isinstance(o, ir_nodes.Reduction) and o.dim != 1}
            parts = {n: t.unbind(0) if n in per_group else torch.split(t, sizes) for n, t in got.items()}
            return [{n: parts[n][e] for n in parts} for e in range(E)]
        return list(torch.split(got, sizes))

    def __repr__(self) -> str:
        return f"GroupedGemm({self.name}, members={list(self._members)})"
