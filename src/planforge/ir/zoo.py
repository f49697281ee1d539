"""The model zoo: the embodied-inference workloads planforge exists for.

Batch-1 control policies, where latency per step matters, and the layers they
are built from. Weights are deterministic (seeded), scaled so activations stay
O(1).
"""
from __future__ import annotations

from typing import Callable

from .graph import Graph, GraphBuilder


def policy_mlp(batch: int = 1, widths: tuple[int, ...] = (256, 256, 256, 32)) -> Graph:
    """x -> Linear+ReLU -> Linear+ReLU -> Linear (the action head): 256 -> 256 -> 256 -> 32."""
    b = GraphBuilder(f"policy-mlp-b{batch}")
    h = b.input("obs", (batch, widths[0]))
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        last = i == len(widths) - 2
        h = b.linear(h, k, n, f"l{i}", act=None if last else "relu")
    return b.output(h)


def drill_mlp() -> Graph:
    """The drill's layer on real kernels: Y = relu(X @ W + b), X [64, 256], W [256, 256]."""
    b = GraphBuilder("drill-mlp")
    x = b.input("x", (64, 256))
    return b.output(b.linear(x, 256, 256, "fc", act="relu"))


def transformer_block(seq: int = 32, width: int = 256, heads: int = 4, mlp: int = 4) -> Graph:
    """A pre-LayerNorm transformer block at batch 1: attention (``heads`` heads) and a GELU MLP, both residual."""
    b = GraphBuilder(f"transformer-block-s{seq}-d{width}")
    return b.output(_block(b, b.input("x", (seq, width)), seq, width, heads, mlp, ""))


def transformer(layers: int = 6, seq: int = 24, width: int = 256, heads: int = 4, mlp: int = 4, seed: int = 0) -> Graph:
    """``layers`` pre-LayerNorm blocks in a row (each with its own weights) and a final LayerNorm."""
    b = GraphBuilder(f"transformer-l{layers}-s{seq}-d{width}", seed=seed)
    x = b.input("x", (seq, width))
    for i in range(layers):
        x = _block(b, x, seq, width, heads, mlp, f"h{i}.")
    return b.output(b.op("layernorm", x, b.vector("lnf.g", width, 0.1, 1.0), b.vector("lnf.b", width), eps=1e-5))


def residual_mlp(blocks: int = 50, width: int = 256, batch: int = 8, seed: int = 0) -> Graph:
    """``blocks`` residual blocks ``x + W2 relu(W1 layernorm(x))``: a deep network's shape without convolutions."""
    b = GraphBuilder(f"residual-mlp-{blocks}x{width}", seed=seed)
    x = b.input("x", (batch, width))
    for i in range(blocks):
        h = b.op("layernorm", x, b.vector(f"b{i}.g", width, 0.1, 1.0), b.vector(f"b{i}.be", width), eps=1e-5)
        h = b.linear(b.linear(h, width, width, f"b{i}.fc1", act="relu"), width, width, f"b{i}.fc2")
        x = b.op("add", x, h)
    return b.output(x)


def _block(b: GraphBuilder, x: str, seq: int, width: int, heads: int, mlp: int, pre: str) -> str:
    dh = width // heads
    h = b.op("layernorm", x, b.vector(pre + "ln1.g", width, 0.1, 1.0), b.vector(pre + "ln1.b", width), eps=1e-5)

    def heads_of(t: str, perm: tuple[int, ...]) -> str:
        return b.op("transpose", b.op("reshape", t, shape=(seq, heads, dh)), perm=perm)

    q = heads_of(b.linear(h, width, width, pre + "attn.q"), (1, 0, 2))      # [H, S, D]
    k = heads_of(b.linear(h, width, width, pre + "attn.k"), (1, 2, 0))      # [H, D, S]
    v = heads_of(b.linear(h, width, width, pre + "attn.v"), (1, 0, 2))      # [H, S, D]
    p = b.op("softmax", b.op("scale", b.op("matmul", q, k), factor=dh ** -0.5))
    ctx = b.op("reshape", b.op("transpose", b.op("matmul", p, v), perm=(1, 0, 2)), shape=(seq, width))
    x = b.op("add", x, b.linear(ctx, width, width, pre + "attn.o"))
    h = b.op("layernorm", x, b.vector(pre + "ln2.g", width, 0.1, 1.0), b.vector(pre + "ln2.b", width), eps=1e-5)
    h = b.op("gelu", b.linear(h, width, mlp * width, pre + "mlp.fc"), approximate="tanh")
    return b.op("add", x, b.linear(h, mlp * width, width, pre + "mlp.proj"))


ZOO: dict[str, Callable[[], Graph]] = {
    "policy-mlp": lambda: policy_mlp(1),
    "policy-mlp-b64": lambda: policy_mlp(64),
    "drill-mlp": drill_mlp,
    "transformer-block": transformer_block,
    "transformer-6": lambda: transformer(6),        # six blocks, d=256, sequence 24: tuned as tasks (two kinds)
    "residual-mlp-50": lambda: residual_mlp(50),    # fifty identical residual blocks: one task of weight 50
}
