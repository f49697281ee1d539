"""The IR as an egglog language, and the rule sets that grow the e-graph.

Two layers of constructors:
- semantic ops (``T.matmul``, ``T.bias``, ``T.linear``, ``mlp`` ...): what is
  computed; they cannot run by themselves;
- implementation e-nodes (``lib1..3``, ``tmpl1..3``, ``fused_mlp``): how; one per
  available implementation (a library call, a compiled template, a fused
  template). The op travels in ``kind`` and its attribute (activation,
  permutation, shape, eps) in ``attr``, e.g. ``tmpl3("linear", "relu", x, w, b)``.
A plan picks one implementation e-node per e-class it needs.
"""
from __future__ import annotations

from egglog import Expr, String, StringLike, function, rewrite, ruleset, var, vars_


class T(Expr):
    """A tensor value."""

    @classmethod
    def input(cls, name: StringLike) -> T: ...

    @classmethod
    def param(cls, name: StringLike) -> T: ...

    @classmethod
    def param_t(cls, name: StringLike) -> T:
        """The parameter stored transposed (column-major); ``param_t(n).transpose("1,0") == param(n)``."""

    def matmul(self, w: T) -> T: ...

    def bias(self, b: T) -> T: ...

    def add(self, y: T) -> T: ...

    def mul(self, y: T) -> T: ...

    def relu(self) -> T: ...

    def gelu(self, approx: StringLike) -> T: ...

    def softmax(self) -> T: ...

    def layernorm(self, g: T, b: T, eps: StringLike) -> T: ...

    def normalize(self, eps: StringLike) -> T: ...

    def exp_shifted(self) -> T: ...

    def div_rowsum(self) -> T: ...

    def transpose(self, perm: StringLike) -> T: ...

    def reshape(self, shape: StringLike) -> T: ...

    def scale(self, factor: StringLike) -> T: ...

    def concat(self, y: T, axis: StringLike) -> T: ...

    def pair(self, y: T) -> T:
        """Groups several graph outputs under one root."""

    def linear(self, w: T, b: T, act: StringLike) -> T:
        """act(self @ w + b): the epilogue-fused form of matmul, bias and an activation."""


class Layers(Expr):
    """The layers of a fused batch-1 MLP, first to last."""

    @classmethod
    def one(cls, w: T, b: T, act: StringLike) -> Layers: ...

    def then(self, w: T, b: T, act: StringLike) -> Layers: ...


@function
def mlp(x: T, layers: Layers) -> T:
    """Consecutive linear layers applied to a single row."""


@function
def output(x: T) -> T:
    """Marks the graph's result, so the root e-class can be found after saturation."""


# implementation e-nodes
@function
def lib1(kind: StringLike, attr: StringLike, a: T) -> T: ...


@function
def lib2(kind: StringLike, attr: StringLike, a: T, b: T) -> T: ...


@function
def lib3(kind: StringLike, attr: StringLike, a: T, b: T, c: T) -> T: ...


@function
def tmpl1(kind: StringLike, attr: StringLike, a: T) -> T: ...


@function
def tmpl2(kind: StringLike, attr: StringLike, a: T, b: T) -> T: ...


@function
def tmpl3(kind: StringLike, attr: StringLike, a: T, b: T, c: T) -> T: ...


@function
def fused_mlp(x: T, layers: Layers) -> T: ...


ACTS = {"relu": "relu", "gelu:tanh": "gelu"}  # activations a compiled epilogue can apply
INVOLUTIONS = ("1,0", "1,0,2", "0,2,1")       # permutations equal to their own inverse

x, y, w, b, g, w2, b2 = vars_("x y w b g w2 b2", T)
s, s2 = var("s", String), var("s2", String)
L = var("L", Layers)

# every semantic op has a library implementation; the hot ones have compiled templates too
lowering = ruleset(
    rewrite(x.matmul(w)).to(lib2("matmul", "", x, w)),
    rewrite(x.matmul(w)).to(tmpl2("matmul", "", x, w)),
    rewrite(x.matmul(w)).to(lib2("matmul_bcast", "", x, w)),  # broadcast-multiply-reduce: materialises [M, K, N]
    rewrite(x.bias(b)).to(lib2("bias", "", x, b)),
    rewrite(x.bias(b)).to(tmpl2("bias", "", x, b)),
    rewrite(x.add(y)).to(lib2("add", "", x, y)),
    rewrite(x.add(y)).to(tmpl2("add", "", x, y)),
    rewrite(x.mul(y)).to(lib2("mul", "", x, y)),
    rewrite(x.relu()).to(lib1("relu", "", x)),
    rewrite(x.relu()).to(tmpl1("relu", "", x)),
    rewrite(x.gelu(s)).to(lib1("gelu", s, x)),
    rewrite(x.gelu("tanh")).to(tmpl1("gelu", "tanh", x)),
    rewrite(x.softmax()).to(lib1("softmax", "", x)),
    rewrite(x.softmax()).to(tmpl1("softmax", "", x)),
    rewrite(x.layernorm(g, b, s)).to(lib3("layernorm", s, x, g, b)),
    rewrite(x.layernorm(g, b, s)).to(tmpl3("layernorm", s, x, g, b)),
    rewrite(x.normalize(s)).to(lib1("normalize", s, x)),
    rewrite(x.exp_shifted()).to(lib1("exp_shifted", "", x)),
    rewrite(x.div_rowsum()).to(lib1("div_rowsum", "", x)),
    rewrite(x.transpose(s)).to(lib1("transpose", s, x)),
    rewrite(x.reshape(s)).to(lib1("reshape", s, x)),
    rewrite(x.scale(s)).to(lib1("scale", s, x)),
    rewrite(x.concat(y, s)).to(lib2("concat", s, x, y)),
    rewrite(x.linear(w, b, s)).to(lib3("linear", s, x, w, b)),
    rewrite(x.linear(w, b, s)).to(tmpl3("linear", s, x, w, b)),
    rewrite(mlp(x, L)).to(fused_mlp(x, L)),
    rewrite(x.pair(y)).to(lib2("pair", "", x, y)),  # several graph outputs: nothing to compute
)

# epilogue fusion: matmul + bias (+ activation) as one kernel
epilogue = ruleset(
    rewrite(x.matmul(w).bias(b)).to(x.linear(w, b, "none")),
    rewrite(x.linear(w, b, "none").relu()).to(x.linear(w, b, "relu")),
    rewrite(x.linear(w, b, "none").gelu("tanh")).to(x.linear(w, b, "gelu:tanh")),
)

# consecutive layers of a batch-1 MLP as one kernel (enabled only when every row count is 1)
mlp_fusion = ruleset(
    *(rewrite(x.linear(w, b, a)).to(mlp(x, Layers.one(w, b, a))) for a in ("none", *ACTS)),
    *(rewrite(mlp(x, L).linear(w, b, a)).to(mlp(x, L.then(w, b, a))) for a in ("none", *ACTS)),
)

# weight layout: a parameter may be stored transposed and read through a transposed view
layout = ruleset(
    rewrite(x.matmul(T.param(s))).to(x.matmul(T.param_t(s).transpose("1,0"))),
)

# algebraic identities
algebra = ruleset(
    *(rewrite(x.transpose(p).transpose(p)).to(x) for p in INVOLUTIONS),
    rewrite(x.bias(b).bias(b2)).to(x.bias(b.add(b2))),
    rewrite(x.layernorm(g, b, s)).to(x.normalize(s).mul(g).bias(b)),
    rewrite(x.softmax()).to(x.exp_shifted().div_rowsum()),
)

RULESETS = {"epilogue": epilogue, "mlp_fusion": mlp_fusion, "layout": layout, "algebra": algebra,
            "lowering": lowering}
