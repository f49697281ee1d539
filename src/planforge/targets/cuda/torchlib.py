"""The library steps of a GPU plan: each op of the registry as torch calls on the device.

A plan's ``lib`` steps (and the torch-eager baseline, which runs the graph op
by op) call ``step(kind, attrs, ins, out)``: the library implementation
``kind`` (a key of ``ops.LIBRARIES``) on device tensors, writing into ``out``
when one is given (with torch's ``out=`` where it has one, else one copy) and
returning the result. An op with a compiled epilogue runs its ``Epilogue.torch``;
the rest are in ``_STEPS``. A kind neither knows (an op added to the registry
since) runs its numpy library step on the host, its operands copied over and
back: correct, and slow, so that a new op never breaks a GPU plan.

torch is imported lazily: the planning side never needs it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...ops import LIBRARIES, REGISTRY


def act(name: str, y):
    """A fused linear's activation (``relu``, ``gelu:tanh``; ``none``) on tensor ``y``."""
    if name in ("none", ""):
        return y
    op_name, _, attr = name.partition(":")
    if op_name == "gelu":
        import torch.nn.functional as F

        return F.gelu(y, approximate=attr or "tanh")
    return REGISTRY[op_name].epilogue.torch(y, None)


def _matmul(ins, attrs, out):
    import torch

    return torch.matmul(ins[0], ins[1], out=out)


def _linear(ins, attrs, out):
    import torch

    a = attrs.get("act", "none")
    if len(ins) > 2 and a in ("none", ""):
        if ins[0].dim() == 2:
            return torch.addmm(ins[2], ins[0], ins[1], out=out)
        return torch.add(torch.matmul(ins[0], ins[1]), ins[2], out=out)
    y = torch.matmul(ins[0], ins[1])
    if len(ins) > 2:
        y = y + ins[2]
    return _into(act(a, y), out)


def _norm(ins, attrs, out):
    import torch.nn.functional as F

    x = ins[0]
    g, b = (ins[1], ins[2]) if len(ins) > 2 else (None, None)
    return _into(F.layer_norm(x, (x.shape[-1],), g, b, float(attrs.get("eps", 1e-5))), out)


def _softmax(ins, attrs, out):
    return _into(ins[0].softmax(-1), out)


def _exp_shifted(ins, attrs, out):
    import torch

    x = ins[0]
    return torch.exp(x - x.amax(-1, keepdim=True), out=out)


def _div_rowsum(ins, attrs, out):
    import torch

    x = ins[0]
    return torch.div(x, x.sum(-1, keepdim=True), out=out)


def _mul(ins, attrs, out):
    import torch

    return torch.mul(ins[0], ins[1], out=out)


def _scale(ins, attrs, out):
    import torch

    return torch.mul(ins[0], float(attrs["factor"]), out=out)


def _transpose(ins, attrs, out):
    perm = attrs.get("perm") or tuple(reversed(range(ins[0].dim())))
    return _into(ins[0].permute(*perm), out)


def _reshape(ins, attrs, out):
    return _into(ins[0].reshape(tuple(attrs["shape"])), out)


def _concat(ins, attrs, out):
    import torch

    return torch.cat(list(ins), dim=int(attrs.get("axis", -1)), out=out)


def _gelu(ins, attrs, out):
    return _into(act("gelu:" + str(attrs.get("approximate", "tanh")), ins[0]), out)


def _sdpa(ins, attrs, out):
    import torch.nn.functional as F

    q, k, v = ins
    gqa = q.dim() >= 3 and q.shape[-3] != k.shape[-3]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(attrs.get("causal")), scale=float(attrs["scale"]),
                                       **({"enable_gqa": True} if gqa else {}))
    return _into(y, out)


def _pow(ins, attrs, out):
    import torch

    return torch.pow(ins[0], float(attrs["exponent"]), out=out)


def _reduce(name: str):
    def step(ins, attrs, out):
        import torch

        x = ins[0]
        axes = attrs.get("axes") or tuple(range(x.dim()))
        y = getattr(torch, name)(x, dim=tuple(int(a) for a in axes), keepdim=bool(attrs.get("keepdim")))
        return _into(y, out)
    return step


def _unary(name: str):
    def step(ins, attrs, out):
        import torch

        return getattr(torch, name)(ins[0], out=out)
    return step


def _binary(name: str):
    def step(ins, attrs, out):
        import torch

        return getattr(torch, name)(ins[0], ins[1], out=out)
    return step


_STEPS: dict[str, Callable] = {
    "matmul": _matmul, "matmul_bcast": _matmul, "linear": _linear, "layernorm": _norm, "normalize": _norm,
    "softmax": _softmax, "exp_shifted": _exp_shifted, "div_rowsum": _div_rowsum, "mul": _mul, "scale": _scale,
    "transpose": _transpose, "reshape": _reshape, "concat": _concat, "gelu": _gelu, "sdpa": _sdpa, "pow": _pow,
    "mean": _reduce("mean"), "sum": _reduce("sum"), "multiply": _binary("mul"), "divide": _binary("div"),
    **{n: _unary(n) for n in ("rsqrt", "sqrt", "reciprocal", "exp", "log", "cos", "sin", "abs")},
}


def _into(y, out):
    if out is None:
        return y
    out.copy_(y)
    return out


def _epilogue(kind: str):
    op = REGISTRY.get(kind)
    ep = op.epilogue if op is not None else None
    if ep is None or ep.torch is None:
        return None
    f = ep.torch
    return lambda ins, attrs, out: _into(f(ins[0], ins[1] if len(ins) > 1 else None), out)


def on_device(kind: str) -> bool:
    """Whether library ``kind`` runs as torch calls on the device (else on the host, through numpy)."""
    return kind in _STEPS or _epilogue(kind) is not None


def bind(kind: str, attrs: dict[str, Any], ins: Sequence[Any], out) -> Callable[[], Any]:
    """Library step ``kind`` bound to device tensors ``ins`` and ``out``: a no-argument call writing ``out``.

    Raises ``KeyError`` naming the kind when the registry has no library implementation of it."""
    f = _STEPS.get(kind) or _epilogue(kind)
    if f is not None:
        ins = list(ins)
        return lambda: f(ins, attrs, out)
    return _host(kind, attrs, ins, out)


def _host(kind: str, attrs: dict[str, Any], ins: Sequence[Any], out) -> Callable[[], Any]:
    """The numpy library step of ``kind`` run on host copies of ``ins``, the result copied into ``out``."""
    import torch

    hit = LIBRARIES.get(kind)
    if hit is None:
        raise KeyError(f"no library implementation of {kind!r}")
    op, lib = hit
    hin = [np.empty(tuple(t.shape), np.float32) for t in ins]
    hout = np.empty(tuple(out.shape), np.float32)
    f = lib.step(hin, hout, attrs)
    back = torch.from_numpy(hout)

    def run():
        for h, t in zip(hin, ins):
            h[...] = t.detach().cpu().numpy()
        f()
        out.copy_(back)
        return out
    return run


def forward(graph, device: str) -> Callable[..., list]:
    """The graph op by op in torch eager on ``device`` (fp32): how a torch user runs it, the library
    baseline of a GPU plan. The returned ``f(*inputs)`` takes and returns device tensors."""
    import torch

    params = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(device)
              for k, v in graph.params.items()}
    shapes = graph.shapes()
    nodes = []
    for n in graph.nodes:
        f = _STEPS.get(n.op) or _epilogue(n.op)
        nodes.append((f, n.op, dict(n.attrs), list(n.inputs), n.output, tuple(shapes[n.output])))
    names, outs = list(graph.inputs), list(graph.outputs)

    def run(*xs):
        env = dict(params)
        env.update(zip(names, xs))
        for f, kind, attrs, ins, o, shape in nodes:
            args = [env[i] for i in ins]
            if f is not None:
                env[o] = f(args, attrs, None)
            else:  # an op with no torch step: through the host, as a plan runs it
                res = torch.empty(shape, dtype=torch.float32, device=args[0].device)
                env[o] = _host(kind, attrs, args, res)()
        return [env[o] for o in outs]
    return run


__all__ = ["act", "bind", "forward", "on_device"]
