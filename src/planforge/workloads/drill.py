"""The drill: a 24-genome plan space of one fused MLP layer with known answers.

Y = act(X @ W + b), X: [64, 256], W: [256, 256] on a GPU. The table
(``data/drill_plans.csv``) gives a deterministic stand-in for a measurement and
a FLOP/byte proxy per genome; two validators reject fp16 accumulation over
K=256 and the [M, N, K] fp32 intermediate of primitive_loop (16 MiB > 8 MiB).
"""
from __future__ import annotations

import csv
from importlib import resources

from ..costmodel import TableProxy
from ..space import Candidate, Space, gene
from ..targets import Target, get_target
from ..targets.table.target import TableTarget
from ..validate import AccumulationCheck, MemoryBudget
from .base import Manifest, Task, Workload, WorkloadError

M, K, N = 64, 256, 256
GENES = {
    "matmul": ("primitive_loop", "tiled_kernel", "cublaslt"),
    "epilogue": ("separate", "fused"),
    "w_layout": ("row", "col"),
    "accumulate": ("fp32", "fp16"),
}
MEMORY_BUDGET = 8 * 2**20
OUTPUT_RTOL = 1e-3  # fp32 output; fp16 accumulation over K=256 cannot meet it


def peak_bytes(c: Candidate) -> int:
    """X, W, b and Y in fp32, plus what the plan materialises."""
    base = 4 * (M * K + K * N + N + M * N)
    if c["matmul"] == "primitive_loop":
        base += 4 * M * N * K  # the [M, N, K] product tensor before the reduction
    if c["epilogue"] == "separate":
        base += 4 * M * N  # the pre-activation tensor
    return base


def read_table() -> list[dict[str, str]]:
    with resources.files("planforge.workloads").joinpath("data/drill_plans.csv").open() as f:
        return list(csv.DictReader(f))


def drill(delay_s: float = 0.0, target: str | Target = "table") -> Workload:
    """Build the drill workload. ``delay_s`` makes each lookup sleep (tests use it to interrupt a run).

    ``target``: the drill's times are a table, so it runs on the ``table`` target (the default) only."""
    target = get_target(target)
    if not isinstance(target, TableTarget):
        raise WorkloadError(f"the drill runs on the 'table' target only (its times are a fixed table), "
                            f"not on {target.name!r}")
    space = Space([gene(name, choices) for name, choices in GENES.items()])
    measured, proxy = {}, {}
    for row in read_table():
        c = space.make({g: row[g] for g in GENES})
        measured[c.fingerprint] = float(row["measured_ns"]) / 1e9
        proxy[c.fingerprint] = float(row["proxy_ns"]) / 1e9
    if len(measured) != space.size:
        raise RuntimeError(f"drill table covers {len(measured)} of {space.size} genomes")
    task = Task(
        key="mlp_layer",
        space=space,
        backend=target.table_backend(measured, label="drill", delay_s=delay_s),
        cost_model=TableProxy(proxy, name="drill proxy"),
        validators=(AccumulationCheck(k=K, rtol=OUTPUT_RTOL), MemoryBudget(MEMORY_BUDGET, peak_bytes)),
        peak_bytes=peak_bytes,
    )
    options = {"delay_s": delay_s} if delay_s else {}
    manifest = Manifest("drill", shapes={"X": [M, K], "W": [K, N], "b": [N]}, dtypes={"X": "fp32", "W": "fp32"},
                        options=options)
    return Workload(manifest, [task], description="one fused MLP layer, 24 genomes, measured by table lookup")
