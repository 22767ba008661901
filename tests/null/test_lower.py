"""The lowering stage (evtc/lower): roles, reduction axes, the visitor tree's contract."""

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import evtc
from evtc import bf16, f32
from evtc.dtypes import f16
from evtc.errors import IRVerificationError
from evtc.ir.axes import ReduceAxis
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import Accumulator, AuxLoad, Bcast, Compute, ReduceOp, Reduction, Store
from evtc.lower import ROLES, Role, Topo, Tree, check_tree, duplicable, lower, role_of
from evtc.passes import run

from strategies import random_epilogues


def test_every_role_has_one_row_with_both_archs():
    assert set(ROLES) == set(Role)
    for role, spec in ROLES.items():
        assert spec.role is role and spec.sm90 and spec.sm80
        assert spec.kind in ("leaf", "compute", "output")
        assert (spec.axis is not None) == role.is_reduction
    # the role value names the template macro, and formats as itself
    assert f"{Role.AUX_LOAD}" == "aux_load" and str(Role.ROW_REDUCTION) == "row_reduction"


@pytest.mark.parametrize("axis", list(ReduceAxis))
def test_reduce_axis_agrees_with_numpy_and_the_ir(axis):
    x = np.arange(2 * 3 * 5, dtype=np.float64).reshape(2, 3, 5)
    got = x.sum(axis=axis.numpy_axis)
    assert got.shape == (2,) + axis.shape(3, 5)
    node = Reduction(f32, name="r", value=None, op=ReduceOp.SUM, dim=axis.dim)
    assert node.bcast is axis.bcast
    assert axis.transposed().transposed() is axis
    # swap-AB: a row reduction of D is a column reduction of D^T
    assert np.array_equal(x.sum(axis=axis.numpy_axis),
                          x.transpose(0, 2, 1).sum(axis=axis.transposed().numpy_axis))


def _chain(depth: int, op: str = "residual") -> Graph:
    """acc -> x = x + gelu(x) (or sigmoid(x) * x) repeated ``depth`` times, with an aux load."""
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    r = b.add(AuxLoad(bf16, name="R"))
    x = b.add(Compute(f32, op="mul", args=(acc, r)))
    for _ in range(depth):
        if op == "residual":
            x = b.add(Compute(f32, op="add", args=(x, b.add(Compute(f32, op="gelu", args=(x,))))))
        else:
            x = b.add(Compute(f32, op="mul", args=(b.add(Compute(f32, op="sigmoid", args=(x,))), x)))
    d = b.add(Store(bf16, name="D", value=x))
    return Graph("chain", (acc, r), (d,))


@pytest.mark.parametrize("op", ["residual", "swish"])
def test_long_chains_lower_in_linear_time_without_recursion(op):
    g = _chain(2000, op)
    t0 = time.process_time()
    tree = lower(g, g.outputs[0])
    elapsed = time.process_time() - t0
    check_tree(g, tree)
    # every x is used twice: one topological region holds the whole chain
    assert isinstance(tree.root, Topo) and len(tree.root.ops) > 4000
    assert elapsed < 5.0, elapsed


def test_check_tree_catches_a_node_evaluated_twice():
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    r = b.add(AuxLoad(bf16, name="R"))
    x = b.add(Compute(f32, op="mul", args=(r, r)))
    g = Graph("sq", (acc, r), (b.add(Store(bf16, name="D", value=b.add(Compute(f32, op="add", args=(x, acc))))),))
    tree = lower(g, g.outputs[0])
    check_tree(g, tree)  # R is read once, by a topological region
    # a hand-made tree that reads R twice (what a plain Sm90EVT<Mul, R, R> would do)
    leaf = Tree(tree.visitors()[0].__class__(r, Role.AUX_LOAD))
    bad = type(tree)(Tree(tree.visitors()[-1].__class__(x, Role.COMPUTE), (leaf, leaf)), g.outputs[0], None)
    with pytest.raises(IRVerificationError, match="2 times"):
        check_tree(g, bad)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(random_epilogues())
def test_random_epilogues_lower_with_every_node_once(ep):
    g = run(ep.trace(), "sm90")
    for d in [o for o in g.outputs if isinstance(o, Store)]:
        tree = lower(g, d)
        check_tree(g, tree)
        # every output but D's is a visitor, and every input the outputs use appears
        names = {v.name for v in tree.visitors()}
        assert {o.name for o in g.outputs if o is not d} <= names
        assert {i.name for i in g.used_inputs if not duplicable(i)} <= names
        assert all(v.role is role_of(v.node) for v in tree.visitors())


def test_roles_of_the_c_slot_and_keep_alive():
    @evtc.epilogue
    def side(acc, C, R: evtc.Matrix):
        return {"D": acc + C, "S": acc * R}  # S does not reach D: kept alive by `first`

    g = run(side.trace(d=f16), "sm90")
    c = g.input("C")
    tree = lower(g, g.output("D"), c)
    roles = [v.role for v in tree.visitors()]
    assert Role.SRC in roles and Role.KEEP in roles and len(tree.keep_nodes) == 1
    assert [v for v in tree.visitors() if v.node is c][0].role is Role.SRC
    paths = tree.paths()
    assert (Role.AUX_STORE, "S") in paths and (Role.AUX_LOAD, "R") in paths


def test_a_leaf_used_several_times_by_one_op_is_a_region_of_three():
    """NOTE [Regions of two ops]: X used three times by multiply_add alone would be a region of
    two ops, which CUTLASS's topological visitors can't hold (cute::repeat<1> is no tuple); a
    pass-through first(X, X) makes three, and the region still computes X once."""

    @evtc.epilogue
    def cube(acc, X: evtc.Matrix):
        return evtc.multiply_add(X, X, X) + acc

    g = run(cube.graph, "sm90")
    tree = lower(g, g.outputs[0])
    topos = []
    stack = [tree.root]
    while stack:
        t = stack.pop()
        if isinstance(t, Topo):
            topos.append(t)
            stack.extend(t.ops)
        else:
            stack.extend(t.children)
    assert len(topos) == 1 and len(topos[0].ops) == 3, topos
    t = topos[0]
    assert t.ops[1].op.role is Role.KEEP and t.edges == ((), (0, 0), (1, 1, 1))
    check_tree(g, tree)
    assert evtc.Gemm(cube, arch="sm80").source.count("evtc::First") >= 1
