"""The epilogue IR: node kinds, the graph, its text form, the verifier and the interpreter."""

from evtc.ir.graph import Graph, GraphBuilder, rebuild
from evtc.ir.interpret import interpret
from evtc.ir.nodes import (Accumulator, AuxLoad, Bcast, ColBroadcast, Compute, Immediate, Leaf, Node, Output, ReduceOp,
                           Reduction, RowBroadcast, ScalarBroadcast, Source, Store)
from evtc.ir.printer import print_graph
from evtc.ir.verify import verify

__all__ = [
    "Accumulator", "AuxLoad", "Bcast", "ColBroadcast", "Compute", "Graph", "GraphBuilder", "Immediate",
    "Leaf", "Node", "Output", "ReduceOp", "Reduction", "RowBroadcast", "ScalarBroadcast", "Source", "Store",
    "interpret", "print_graph", "rebuild", "verify",
]
