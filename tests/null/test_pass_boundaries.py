"""Pass boundaries: internal failures become located PassErrors, verifier and ensures failures
name the pass, every IR rule a user can break is enforced without a debug flag, the target
rules hold for a normal user, verification is an explicit setting, and the sympy round trip
accepts only real, finite results (issues 9 and 14)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import sympy

import evtc
from evtc import bf16, e4m3, f32, passes
from evtc.dtypes import DType
from evtc.errors import EvtcError, IRVerificationError, LegalizeError, PassError, SourceLoc
from evtc.ir import verify
from evtc.ir.graph import Graph
from evtc.ir.nodes import (Accumulator, AuxLoad, Compute, Immediate, ReduceOp, Reduction, RowBroadcast,
                           ScalarBroadcast, Store)
from evtc.ir.verify import RULES, Violation, violations
from evtc.ir.graph import with_inputs
from evtc.passes import PIPELINE, Pass, PassManager, PassResult
from evtc.passes import canonicalize as canonicalize_fn
from evtc.passes.manager import rewrite, verification_enabled, visit

canon = importlib.import_module("evtc.passes.canonicalize")  # evtc.passes.canonicalize is the function


def ir(body: str, params: str = "acc: f32 accumulator") -> Graph:
    lines = [l.strip() for l in body.strip().splitlines()]
    return evtc.parse_ir(f"epilogue t({params}):\n" + "\n".join("  " + l for l in lines) + "\n")


@pytest.fixture
def no_debug(monkeypatch):
    """A normal user: no EVTC_VERIFY, no EVTC_DEBUG."""
    monkeypatch.delenv("EVTC_VERIFY", raising=False)
    monkeypatch.delenv("EVTC_DEBUG", raising=False)


# ---- internal failures are PassErrors naming the pass ---------------------------------------------

def test_an_exception_inside_a_pass_is_a_located_pass_error(monkeypatch):
    from evtc import ops

    def boom(*a):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(ops.OPS, "exp", dataclasses.replace(ops.OPS["exp"], numpy=boom))
    g = ir("""
        %0 = exp(2.0) : f32
        %1 = mul(acc, %0) : f32
        D = store(%1) : bf16
    """)
    with pytest.raises(PassError) as ei:
        passes.run(g, "sm90")
    err = ei.value
    text = str(err)
    assert "internal error in pass 'fold': ZeroDivisionError: boom" in text
    assert "passes run before it: propagate" in text
    assert "> %0 = exp(2.0) : f32" in text  # the IR window, the node marked
    assert err.loc is not None and err.loc.line == 2 and err.epilogue == "t"
    assert isinstance(err.__cause__, ZeroDivisionError) and "bug in evtc" in err.hint
    assert "#pass-error" in text


def test_only_evtc_errors_leave_gemm(monkeypatch):
    from evtc import ops

    monkeypatch.setitem(ops.OPS, "exp", dataclasses.replace(ops.OPS["exp"], numpy=lambda *a: 1 / 0))
    g = ir("""
        %0 = exp(2.0) : f32
        %1 = mul(acc, %0) : f32
        D = store(%1) : bf16
    """)
    with pytest.raises(EvtcError) as ei:
        evtc.Gemm(g)
    assert type(ei.value) is PassError


def _failing_at(op_name: str, exc: Exception) -> Pass:
    def fn(graph):
        def rule(node, inputs, b):
            if isinstance(node, Compute) and node.op == op_name:
                raise exc
            return with_inputs(node, inputs)

        return PassResult.of(graph, rewrite(graph, rule))

    return Pass("broken", fn)


def test_a_custom_pass_failure_names_it_and_its_predecessors():
    g = ir("""
        %0 = relu(acc) : f32
        %1 = sigmoid(%0) : f32
        %2 = tanh(%1) : f32
        D = store(%2) : bf16
    """)
    pm = PassManager(PIPELINE[:3] + (_failing_at("sigmoid", KeyError("gone")),))
    with pytest.raises(PassError) as ei:
        pm(g)
    text = str(ei.value)
    assert "internal error in pass 'broken': KeyError" in text
    assert "passes run before it: propagate, fold, simplify" in text
    assert "> %1 = sigmoid(%0) : f32" in text and ei.value.loc.line == 3


def test_recursion_error_inside_a_pass_is_wrapped():
    g = ir("""
        %0 = relu(acc) : f32
        D = store(%0) : bf16
    """)
    with pytest.raises(PassError, match="RecursionError"):
        PassManager((_failing_at("relu", RecursionError("deep")),))(g)


def test_a_pass_that_only_looks_reports_its_node():
    def looking(graph):
        for n in visit(graph.nodes):
            if isinstance(n, Compute) and n.op == "tanh":
                raise ValueError("no tanh")
        return PassResult(graph, False)

    g = ir("""
        %0 = relu(acc) : f32
        %1 = tanh(%0) : f32
        D = store(%1) : bf16
    """)
    with pytest.raises(PassError) as ei:
        PassManager((Pass("look", looking),))(g)
    assert "> %1 = tanh(%0) : f32" in str(ei.value) and "passes run before it: (none)" in str(ei.value)


def test_a_pass_must_return_a_pass_result():
    g = ir("D = store(acc) : bf16")
    with pytest.raises(PassError, match="returned Graph, not a PassResult"):
        PassManager((Pass("old_style", lambda graph: graph),))(g)


def test_user_errors_from_a_pass_pass_through_unwrapped():
    g = ir("""
        %0 = log(-1.0) : f32
        %1 = add(acc, %0) : f32
        D = store(%1) : bf16
    """)
    with pytest.raises(evtc.errors.ConstantFoldError) as ei:
        passes.run(g, "sm90")
    assert ei.value.__cause__ is None and ei.value.loc.line == 2


# ---- verifier and ensures failures name the pass --------------------------------------------------

def _bf16_relu(graph):
    def rule(node, inputs, b):
        new = with_inputs(node, inputs)
        if isinstance(new, Compute) and new.op == "relu":
            return dataclasses.replace(new, dtype=bf16)
        return new

    return PassResult.of(graph, rewrite(graph, rule))


def test_a_pass_that_breaks_an_invariant_is_named():
    g = ir("""
        %0 = relu(acc) : f32
        D = store(%0) : bf16
    """)
    pm = PassManager(PIPELINE[:2] + (Pass("evil", _bf16_relu),), verify=True)
    with pytest.raises(IRVerificationError) as ei:
        pm(g)
    text = str(ei.value)
    assert "after pass 'evil': 'relu' computes in f32, not bf16" in text
    assert "(passes run: propagate, fold, evil)" in text and "> %0 = relu(acc) : bf16" in text
    # without verification the manager trusts the pass
    assert not PassManager(PIPELINE[:2] + (Pass("evil", _bf16_relu),), verify=False)(g).graph.nodes[1].dtype is f32


def test_a_broken_ensures_is_named():
    g = ir("""
        %0 = relu(acc) : f32
        D = store(%0) : bf16
    """)
    relu = g.nodes[1]
    lazy = Pass("lazy", lambda graph: PassResult(graph, False),
                ensures=lambda graph: Violation("no-relu", "a relu is left", relu))
    with pytest.raises(IRVerificationError) as ei:
        PassManager((lazy,), verify=True)(g)
    assert "after pass 'lazy': it ensures 'no-relu', but a relu is left" in str(ei.value)
    assert "> %0 = relu(acc) : f32" in str(ei.value)


# ---- verification is an explicit setting (issue 9) ------------------------------------------------

def test_verification_is_on_in_the_test_suite():
    # tests/conftest.py sets EVTC_VERIFY=1; nothing is inferred from imported modules
    import os

    assert os.environ.get("EVTC_VERIFY") == "1" and verification_enabled()


@pytest.mark.parametrize("verify_env,debug_env,want", [
    (None, None, False), ("1", None, True), ("true", None, True), ("0", None, False), ("off", "1", False),
    (None, "1", True), (None, "yes", True), (None, "0", False), ("", "1", False),
])
def test_verification_setting(monkeypatch, verify_env, debug_env, want):
    import sys

    assert "pytest" in sys.modules  # and yet, without a setting, verification is off
    for name, value in (("EVTC_VERIFY", verify_env), ("EVTC_DEBUG", debug_env)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert verification_enabled() is want


def test_a_bad_setting_is_a_config_error(monkeypatch):
    monkeypatch.setenv("EVTC_VERIFY", "sometimes")
    with pytest.raises(evtc.ConfigError, match="EVTC_VERIFY='sometimes' is neither on nor off"):
        verification_enabled()


def test_the_setting_decides_whether_a_broken_pass_is_caught(monkeypatch, no_debug):
    g = ir("""
        %0 = relu(acc) : f32
        D = store(%0) : bf16
    """)
    pm = PassManager(PIPELINE[:2] + (Pass("evil", _bf16_relu),))
    pm(g)  # off: not checked
    monkeypatch.setenv("EVTC_DEBUG", "1")
    with pytest.raises(IRVerificationError, match="after pass 'evil'"):
        pm(g)


# ---- every IR rule a user can break holds without a debug flag (issue 14) ---------------------------

F64 = DType("f64", 64, "double", "float64", (2, 64), 1.7976931348623157e308, 52)


def _loc(line: int) -> SourceLoc:
    return SourceLoc("<test>", line, 0, 4, "line")


def _rule_cases() -> dict[str, tuple[Graph, int]]:
    """rule -> (a graph breaking it and nothing before it, the line the error must point at)."""
    acc = Accumulator(f32, name="acc", loc=_loc(1))

    def g(outputs, inputs=(acc,), loc=_loc(99)):
        return Graph("bad", tuple(inputs), tuple(outputs), loc)

    def store(value, name="D", dtype=bf16, line=9):
        return Store(dtype, name=name, value=value, loc=_loc(line))

    relu = Compute(f32, op="relu", args=(acc,), loc=_loc(2))
    d1 = store(acc, "D1", line=3)
    reordered = g([store(relu)])
    reordered.__dict__["nodes"] = tuple(reversed(reordered.nodes))  # what a broken pass could emit
    return {
        "inputs-are-leaves": (g([store(acc)], inputs=(acc, Immediate(f32, value=1.0))), 99),
        "unique-parameters": (g([store(acc)], inputs=(acc, ScalarBroadcast(f32, name="s"),
                                                      ScalarBroadcast(f32, name="s"))), 99),
        "one-accumulator": (g([store(acc)], inputs=(acc, Accumulator(f32, name="acc2"))), 99),
        "has-outputs": (g([]), 99),
        "defined-before-use": (reordered, 9),
        "outputs-are-terminal": (g([d1, store(Compute(f32, op="relu", args=(d1,), loc=_loc(4)))]), 4),
        "outputs-listed": (g([store(Compute(f32, op="relu", args=(d1,), loc=_loc(4)))]), 3),
        "leaves-declared": (g([store(AuxLoad(bf16, name="X", loc=_loc(5)))]), 5),
        "accumulator-f32": (g([store(acc16 := Accumulator(bf16, name="acc", loc=_loc(6)))], inputs=(acc16,)), 6),
        "tensor-dtype": (g([store(acc, dtype=F64, line=7)]), 7),
        "immediate-f32": (g([store(Compute(f32, op="mul", args=(acc, Immediate(bf16, value=2.0, loc=_loc(8))),
                                           loc=_loc(2)))]), 8),
        "immediate-range": (g([store(Compute(f32, op="mul", args=(acc, Immediate(f32, value=1e39, loc=_loc(8))),
                                             loc=_loc(2)))]), 8),
        "known-op": (g([store(Compute(f32, op="softplus", args=(acc,), loc=_loc(2)))]), 2),
        "arity": (g([store(Compute(f32, op="add", args=(acc,), loc=_loc(2)))]), 2),
        "convert-target": (g([store(Compute(F64, op="convert", args=(acc,), loc=_loc(2)))]), 2),
        "compute-f32": (g([store(Compute(bf16, op="relu", args=(acc,), loc=_loc(2)))]), 2),
        "pow-exponent": (g([store(Compute(f32, op="pow", args=(acc, acc), loc=_loc(2)))]), 2),
        "unique-output-names": (g([store(acc, "D", line=3), store(relu, "D", line=4)]), 4),
        "output-mn": (g([store(bias := RowBroadcast(f32, name="bias"), line=5)], inputs=(acc, bias)), 5),
        "reduction-dim": (g([store(acc), Reduction(f32, name="S", value=acc, op=ReduceOp.SUM, dim=2, loc=_loc(6))]), 6),
        # a quantized value stored without its scales
        "quantize-pair": (g([store(Compute(e4m3, op="group_quant", args=(acc,), attrs=(("convention", "vllm"),
                                                                                        ("group", 128)), loc=_loc(2)),
                                   dtype=e4m3)]), 2),
        # a glu value (N / 2 columns) beside another output
        "glu-store": (g([store(Compute(f32, op="glu", args=(acc,), attrs=(("act", "silu"),), loc=_loc(3)), line=3),
                         store(acc, name="E", line=4)]), 4),
    }


CASES = _rule_cases()


def test_every_verifier_rule_has_a_case():
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_verifier_rule_is_enforced_without_a_debug_flag(rule, no_debug):
    graph, line = CASES[rule]
    first = next(violations(graph))
    assert first.rule == rule, f"the case for {rule} breaks {first.rule} first"
    cls = RULES[rule][1]
    with pytest.raises(EvtcError) as ei:
        passes.run(graph, "sm90")
    err = ei.value
    assert type(err) is cls and first.message.split("\n")[0] in err.message
    assert err.loc is not None and err.loc.line == line and err.epilogue == "bad"
    # the same rule, through the verifier, in debug mode
    with pytest.raises(IRVerificationError):
        verify(graph)


# ---- the target's rules hold for a normal user (issue 14) ------------------------------------------

@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_a_reduction_into_fp8_is_rejected_for_a_normal_user(arch, no_debug):
    @evtc.epilogue
    def fp8_reduction(acc):
        return {"D": acc, "S": evtc.sum(acc, dim=0).to(evtc.e4m3)}

    with pytest.raises(LegalizeError) as ei:
        evtc.Gemm(fp8_reduction, arch=arch)
    err = ei.value
    assert "column reduction 'S' can't be written as e4m3" in err.message
    assert err.loc is not None and "evtc.sum(acc, dim=0).to(evtc.e4m3)" in err.loc.text
    assert "f32, f16 or bf16" in err.message and "#legalize" in str(err)


@pytest.mark.parametrize("dt", [f32, evtc.f16, bf16])
def test_reductions_into_16_and_32_bit_types_stay_legal(dt, no_debug):
    @evtc.epilogue
    def red(acc):
        return {"D": acc, "S": evtc.max(acc, dim=1).to(dt)}

    assert "reduce_max" in str(evtc.Gemm(red).graph)


def test_scalar_reduction_and_collective_d_rules_for_a_normal_user(no_debug):
    @evtc.epilogue
    def amax16(acc):
        return {"D": acc, "amax": evtc.amax(acc).to(bf16)}

    @evtc.epilogue
    def only_reductions(acc):
        return {"s": evtc.sum(acc, dim=1)}

    with pytest.raises(LegalizeError, match="scalar reduction 'amax' must be f32") as ei:
        evtc.Gemm(amax16, arch="sm80")
    assert "evtc.amax(acc).to(bf16)" in ei.value.loc.text
    with pytest.raises(LegalizeError, match="on sm90 the collective epilogue stores D") as ei:
        evtc.Gemm(only_reductions)
    assert ei.value.loc is not None and "def only_reductions" in ei.value.loc.text
    assert "reduce_sum" in str(evtc.Gemm(only_reductions, arch="sm80").graph)  # no collective on sm80


def test_the_ir_knows_no_target():
    g = ir("S = reduce_sum(acc, dim=1) : f32")
    verify(g)  # an epilogue of reductions only is valid IR
    with pytest.warns(DeprecationWarning, match="arch rules moved to evtc.passes.legalize"):
        verify(g, "sm90")
    with pytest.raises(LegalizeError):
        passes.run(g, "sm90")
    passes.run(g, "sm80")


def test_an_unknown_arch_is_a_config_error():
    with pytest.raises(evtc.ConfigError, match="unknown arch 'sm70'"):
        passes.run(ir("D = store(acc) : bf16"), "sm70")


# ---- the sympy round trip accepts only real, finite results (issue 9) ------------------------------

def test_division_by_zero_compiles():
    @evtc.epilogue
    def div0(acc):
        return (acc / 0.0) * 2.0

    gemm = evtc.Gemm(div0)
    text = str(gemm.graph)
    assert "div(acc, 0.0)" in text and "mul(%0, 2.0)" in text


@pytest.mark.parametrize("bad", [sympy.zoo, sympy.nan, sympy.oo, -sympy.oo, sympy.I, sympy.Float(1e39),
                                 sympy.Integer(10) ** 400, sympy.pi])
def test_representable_refuses(bad):
    x = sympy.Symbol("v0", real=True)
    assert not canon.representable(bad * x + 1)
    assert not canon.representable(x ** bad) or bad.is_real and bad.is_finite and abs(float(bad)) <= f32.max


@pytest.mark.parametrize("good", ["6*v0", "v0/3 + v1", "v0**2 - 0.5*v1", "1/(v0*v1)", "v0**(-2)", "-v0 + 3.4e38"])
def test_representable_accepts(good):
    assert canon.representable(sympy.sympify(good, locals={"v0": sympy.Symbol("v0", real=True),
                                                            "v1": sympy.Symbol("v1", real=True)}))


@pytest.mark.parametrize("bad", [sympy.zoo, sympy.nan, sympy.oo, sympy.I])
def test_a_non_real_or_infinite_sympy_result_keeps_the_original(monkeypatch, bad):
    g = ir("""
        %0 = mul(3.0, acc) : f32
        %1 = mul(2.0, %0) : f32
        D = store(%1) : bf16
    """)
    assert canonicalize_fn(g).changed  # sympy's own result (6*acc) is taken
    monkeypatch.setattr(canon, "_canonical_form", lambda expr: 6 * sympy.Symbol("v0", real=True) * bad)
    r = canonicalize_fn(g)
    assert not r.changed and str(r.graph) == str(g)


def test_huge_constants_from_sympy_are_refused():
    # 1e30 * (1e30 * acc) is 1e60 * acc in sympy: not an f32 constant; the product stays
    g = ir("""
        %0 = mul(1e30, acc) : f32
        %1 = mul(1e30, %0) : f32
        D = store(%1) : bf16
    """)
    assert not canonicalize_fn(g).changed
