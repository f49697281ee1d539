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


# -- convolutional models (issue 14): NCHW, batch norms with inference statistics, residual blocks ----------------

def _conv_bn(b: GraphBuilder, x: str, cin: int, cout: int, k: int, pre: str, stride: int = 1, groups: int = 1,
             act: str | None = "relu") -> str:
    """conv (no bias) -> batchnorm -> act, He-scaled weights and non-trivial statistics."""
    import numpy as np

    fan = cin // groups * k * k
    w = b.param(pre + ".w", b.rng.standard_normal((cout, cin // groups, k, k), dtype=np.float32)
                * np.float32((2.0 / fan) ** 0.5))
    st = np.stack([1.0 + 0.1 * b.rng.standard_normal(cout), 0.1 * b.rng.standard_normal(cout),
                   0.1 * b.rng.standard_normal(cout), 1.0 + 0.2 * b.rng.random(cout)])
    p = k // 2
    h = b.op("conv2d", x, w, kernel=(k, k), stride=(stride, stride), pads=(p, p, p, p), dilation=(1, 1), groups=groups)
    h = b.op("batchnorm", h, b.param(pre + ".bn", st), eps=1e-5)
    return b.op(act, h) if act else h


def _basic_block(b: GraphBuilder, x: str, cin: int, cout: int, stride: int, pre: str) -> str:
    """ResNet's basic block: relu(bn(conv(relu(bn(conv(x))))) + shortcut), a 1x1 conv shortcut when it downsamples."""
    h = _conv_bn(b, x, cin, cout, 3, pre + ".c1", stride)
    h = _conv_bn(b, h, cout, cout, 3, pre + ".c2", act=None)
    sc = x if stride == 1 and cin == cout else _conv_bn(b, x, cin, cout, 1, pre + ".down", stride, act=None)
    return b.op("relu", b.op("add", h, sc))


def conv_bn_relu(size: int = 16, cin: int = 8, cout: int = 16) -> Graph:
    """One Conv3x3-BN-ReLU block: the seeds' phase-ordering example."""
    b = GraphBuilder(f"conv-bn-relu-{cin}x{size}x{size}")
    return b.output(_conv_bn(b, b.input("x", (1, cin, size, size)), cin, cout, 3, "c"))


def tiny_resnet(size: int = 32, width: int = 16, blocks: tuple[int, ...] = (2, 2), classes: int = 10,
                seed: int = 0, stem: tuple[int, int] = (3, 1), name: str = "") -> Graph:
    """A small ResNet: a stem convolution (``stem``: kernel and stride; 3x3 stride 1 by default), max pool, stages of
    basic blocks (each stage after the first halves the size and doubles the width), global average pool and a
    linear head; identical blocks of a stage make one task."""
    b = GraphBuilder(name or f"resnet-tiny-{size}-w{width}", seed=seed)
    h = _conv_bn(b, b.input("x", (1, 3, size, size)), 3, width, stem[0], "stem", stem[1])
    h = b.op("maxpool2d", h, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1))
    cin = width
    for s, n in enumerate(blocks):
        cout = width * 2 ** s
        for i in range(n):
            h = _basic_block(b, h, cin, cout, 2 if s and not i else 1, f"s{s}.b{i}")
            cin = cout
    h = b.op("reshape", b.op("adaptive_avg_pool2d", h, out=(1, 1)), shape=(1, cin))
    return b.output(b.linear(h, cin, classes, "fc"))


def resnet18(size: int = 224, classes: int = 1000, seed: int = 0) -> Graph:
    """ResNet-18 (He et al.): a 7x7 stride-2 stem, max pool, four stages of two basic blocks at widths 64-512, global
    average pool, a 1000-way linear head; batch norms with inference statistics, random weights."""
    return tiny_resnet(size, 64, (2, 2, 2, 2), classes, seed, stem=(7, 2), name=f"resnet18-{size}")


def mobile_block(size: int = 16, cin: int = 16, expand: int = 4) -> Graph:
    """MobileNetV2's inverted residual: 1x1 expand (relu6), 3x3 depthwise (relu6), 1x1 project, residual add."""
    b = GraphBuilder(f"mobile-block-{cin}x{size}")
    x = b.input("x", (1, cin, size, size))
    h = _conv_bn(b, x, cin, cin * expand, 1, "exp", act="relu6")
    h = _conv_bn(b, h, cin * expand, cin * expand, 3, "dw", groups=cin * expand, act="relu6")
    h = _conv_bn(b, h, cin * expand, cin, 1, "proj", act=None)
    return b.output(b.op("add", x, h))


ZOO["conv-bn-relu"] = conv_bn_relu
ZOO["resnet-tiny"] = tiny_resnet
ZOO["resnet18"] = resnet18
ZOO["mobile-block"] = mobile_block
