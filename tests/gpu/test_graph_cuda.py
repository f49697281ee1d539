"""Whole models on the cuda target: planned with its templates and knobs, lowered to Triton and torch, run.

On CI the plans run in Triton's interpreter with torch tensors on the CPU (see conftest.py); on a GPU
(``PLANFORGE_TEST_DEVICE=cuda``) the same tests launch the compiled kernels. Shapes are small and not
divisible by any block, and every plan is checked against numpy's fp32 forward and the fp64 reference.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]'): the GPU templates "
                                     "cannot run, even in its interpreter")

from planforge.ir import zoo  # noqa: E402
from planforge.targets.cpu.graph import numpy_forward  # noqa: E402
from planforge.targets.cuda import CudaTarget  # noqa: E402
from planforge.targets.cuda.devices import offline  # noqa: E402
from planforge.targets.cuda.graph import CudaGraphBackend, tolerance  # noqa: E402
from planforge.targets.cuda.plan import CudaPlan  # noqa: E402
from planforge.targets.target import TargetError  # noqa: E402
from planforge.workloads.models import graph_workload  # noqa: E402

from .conftest import DEVICE  # noqa: E402

TEMPLATES = ("tmpl1", "tmpl2", "tmpl3", "fused_mlp")


def _target() -> CudaTarget:
    # the H200's figures plan; the kernels run where the tests run (the interpreter on CI)
    return CudaTarget(pinned=offline("H200"), device=DEVICE)


def _task(graph):
    wl = graph_workload(graph, graph.name, target=_target())
    assert len(wl.tasks) == 1
    return wl.tasks[0]


def _genomes(task, n: int, seed: int = 0) -> list:
    """The task's seed plans, then ``n`` sampled ones with every template's knob setting drawn (not the first);
    on a GPU half as many (each new knob setting compiles there, and the GPU check's test step is short)."""
    rng = random.Random(seed)
    n = n if DEVICE == "cpu" else max(2, n // 2)
    out = list(task.seeds)
    sp = task.space
    for _ in range(n):
        cfg = sp.sample(rng).as_dict()
        for name, k in zip(sp.names, sp.knobs):
            if name.startswith("k_") and len(k.values) > 1:
                cfg[name] = rng.randrange(1, len(k.values))  # a non-default setting of each template
        out.append(sp.make(cfg))
    return out


def _check(graph, program) -> set[str]:
    """Run ``program`` lowered for the device on the graph's example inputs; assert it matches numpy's fp32
    forward and the fp64 reference within the plan tolerance; return the template kinds it ran."""
    xs = graph.example_inputs(3)
    ref = graph.evaluate(*xs)
    tol = tolerance(graph, ref)
    got = CudaPlan(graph, program, DEVICE)(*xs)
    for o, r, f in zip(got, ref, numpy_forward(graph)(*xs)):
        assert o.shape == r.shape
        assert float(np.abs(o - r).max()) <= tol
        assert float(np.abs(o - f).max()) <= tol
    return {s["problem"]["op"] for s in program if s["op"] in TEMPLATES}


def test_policy_mlp_at_batch_1_plans_fused_mlp_and_gemv_templates():
    g = zoo.policy_mlp(1, widths=(19, 40, 33, 5))
    task = _task(g)
    kinds, knobs = set(), []
    for c in _genomes(task, 6):
        prog = task.backend.genome.program(c.as_dict())
        kinds |= _check(g, prog)
        knobs += [s["knobs"] for s in prog if s["op"] in TEMPLATES]
    task.backend.close()
    assert {"mlp", "gemv"} <= kinds  # the fused chain and the one-row GEMM with its epilogue were both run
    # knob settings come from the GPU templates' spaces (Triton launch knobs), and more than one was run
    assert all("num_warps" in k for k in knobs)
    assert len({tuple(sorted(k.items())) for k in knobs}) > 2


def test_policy_mlp_batched_lowers_to_gemm_epilogues():
    g = zoo.policy_mlp(3, widths=(21, 34, 17, 6))
    task = _task(g)
    kinds = set()
    for c in _genomes(task, 4, seed=1):
        kinds |= _check(g, task.backend.genome.program(c.as_dict()))
    task.backend.close()
    assert "gemm" in kinds


def test_transformer_block_lowers_gemm_rowwise_and_eltwise_templates():
    g = zoo.transformer_block(seq=7, width=24, heads=2, mlp=2)
    task = _task(g)
    kinds, epilogues = set(), set()
    for c in _genomes(task, 3, seed=2):
        prog = task.backend.genome.program(c.as_dict())
        kinds |= _check(g, prog)
        epilogues |= {s["problem"]["epilogue"] for s in prog if s["op"] in TEMPLATES}
    task.backend.close()
    assert {"gemm", "layernorm", "softmax", "eltwise"} <= kinds
    assert "bias_gelu" in epilogues  # the MLP's GELU fused into its GEMM's epilogue


def test_a_plan_with_a_wrong_step_fails_the_check():
    g = zoo.policy_mlp(3, widths=(21, 34, 17, 6))
    task = _task(g)
    g_choice = task.seeds[0]
    prog = task.backend.genome.program(g_choice.as_dict())
    task.backend.close()
    steps = [s for s in prog if s["op"] in TEMPLATES and s["problem"]["op"] == "gemm"]
    assert steps and steps[0]["problem"]["epilogue"] == "bias_relu"
    steps[0]["problem"] = {**steps[0]["problem"], "epilogue": "bias"}  # the ReLU dropped
    with pytest.raises(AssertionError):
        _check(g, prog)


def test_the_graph_backend_measures_checks_and_baselines_in_an_isolated_worker():
    g = zoo.policy_mlp(1, widths=(19, 40, 33, 5))
    t = _target()
    wl = graph_workload(g, g.name, target=t)
    b = wl.tasks[0].backend
    try:
        assert isinstance(b, CudaGraphBackend) and b.fingerprint == offline("H200").fingerprint
        c = wl.tasks[0].seeds[0]
        (o,) = b.measure([c])
        assert o.ok and o.times, o.message
        libs = b.baselines()
        assert set(libs) == {"torch"} and libs["torch"].ok, libs["torch"].message
        outs, libs2 = b.remeasure([c], rounds=2)
        assert outs[0].ok and libs2["torch"].ok
        bad = b.program(c)
        for s in bad:
            if s["op"] == "fused_mlp":
                s["problem"] = {**s["problem"], "layers": [[k, n, "none"] for k, n, _ in s["problem"]["layers"]]}
            elif s["op"] in TEMPLATES and s["problem"].get("epilogue") == "bias_relu":
                s["problem"] = {**s["problem"], "epilogue": "bias"}
        o2 = b._run(b._job("plan", bad))
        assert not o2.ok and o2.category == "correctness", o2
        assert b.work()["flops"] > 0 and b.device_profile()["cpu_model"] == "NVIDIA H200"
    finally:
        b.close()
    # the spec side: a plan rebuilt from a recorded program, and the torch baseline as a plan
    xs = g.example_inputs(0)
    ref = g.evaluate(*xs)
    for plan in (t.plan(g, b.program(c)), t.plan(g, None)):
        (y,) = plan(*xs)
        assert float(np.abs(y - ref[0]).max()) <= tolerance(g, ref)
    assert t.peak_bytes(g, b.program(c)) >= g.param_bytes()


def test_a_template_without_triton_code_is_not_a_plan_choice(monkeypatch):
    """A registry activation the Triton epilogues do not implement (here: ReLU, taken away) leaves its template
    e-nodes out of the genome; its layers run as torch library steps, still correctly."""
    from planforge.targets.cuda import problem

    monkeypatch.setattr(problem, "TRITON_ACTS", tuple(a for a in problem.TRITON_ACTS if a != "relu"))
    g = zoo.policy_mlp(3, widths=(21, 34, 17, 6))
    task = _task(g)
    progs = [task.backend.genome.program(c.as_dict()) for c in _genomes(task, 4, seed=3)]
    task.backend.close()
    for prog in progs:
        assert not any(s["problem"]["epilogue"] == "bias_relu" for s in prog if s["op"] in TEMPLATES)
        _check(g, prog)
    assert any(s["op"] == "lib1" and s["args"][0] == "relu" for prog in progs for s in prog)


def _no_gpu() -> bool:
    from planforge.targets.cuda.probe import no_gpu_reason

    return no_gpu_reason() is not None


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU: the no-GPU errors cannot show")
def test_without_a_gpu_a_whole_model_fails_early_and_names_offline(cli):
    with pytest.raises(TargetError, match="--offline"):
        graph_workload(zoo.policy_mlp(1, widths=(8, 8, 4)), "p", target="cuda")
    with pytest.raises(TargetError, match="plans offline for the H200"):
        graph_workload(zoo.policy_mlp(1, widths=(8, 8, 4)), "p", target=CudaTarget(offline="H200"))
    r = cli("tune", "--workload", "policy-mlp", "--target", "cuda", "--budget", "2")
    err = " ".join(r.stderr.split())
    assert r.returncode != 0 and "--offline" in err and "Traceback" not in err, r.stderr


def test_a_torch_module_tunes_for_cuda_end_to_end_and_its_spec_loads(tmp_path):
    """``planforge.tune(module, example_inputs=..., target=...)`` on the cuda target: the search measures GPU
    plans in the isolated worker beside torch eager, writes a spec, and the spec loads back as a plan. (Under
    the interpreter torch eager wins, so the spec falls back to it; the tuned plan itself is loaded above.)"""
    torch = pytest.importorskip("torch")
    import planforge
    from planforge.ir import from_torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(19, 40), torch.nn.ReLU(), torch.nn.Linear(40, 5))
    x = torch.randn(1, 19)
    t = _target()
    r = planforge.tune(m, example_inputs=(x,), target=t, budget=2, out=tmp_path)
    assert r.spec["target"] == {"backend": "cuda", "fingerprint": offline("H200").fingerprint}
    task = r.spec["tasks"]["graph"]
    assert "torch" in task["baselines"] and any(s["op"] in TEMPLATES for s in task["program"])
    y = planforge.load(r.spec_path, target=t, graph=from_torch(m, (x,)))(x.numpy())
    y = y[0] if isinstance(y, list) else y
    assert np.abs(np.asarray(y) - m(x).detach().numpy()).max() < 1e-4


def test_a_plan_replays_as_one_cuda_graph_on_a_gpu():
    """On a GPU a plan's launches are captured into one CUDA graph and replayed with the same results; in the
    interpreter (or with a step on the host) there is nothing to capture and the plan launches step by step."""
    g = zoo.transformer_block(seq=7, width=24, heads=2, mlp=2)
    task = _task(g)
    prog = task.backend.genome.program(task.seeds[0].as_dict())
    task.backend.close()
    xs = g.example_inputs(1)
    ref = g.evaluate(*xs)
    plan = CudaPlan(g, prog, DEVICE)
    replay = plan.graphed()
    if DEVICE == "cpu":
        assert replay is None
        return
    assert replay is not None
    plan.arena.fill_(float("nan"))
    plan.load(*xs)
    replay()
    (y,) = [o.cpu().numpy() for o in plan.outputs]
    assert float(np.abs(y - ref[0]).max()) <= tolerance(g, ref)


def test_a_library_op_without_a_torch_step_runs_on_the_host(monkeypatch):
    """A library kind torchlib has no torch form of (here: matmul and transpose, taken away) runs its numpy step
    on host copies: the plans stay right, and such a plan is not captured as a CUDA graph."""
    import torch

    from planforge.targets.cuda import torchlib

    monkeypatch.setattr(torchlib, "_STEPS", {k: v for k, v in torchlib._STEPS.items()
                                             if k not in ("matmul", "transpose")})
    g = zoo.transformer_block(seq=7, width=24, heads=2, mlp=2)
    task = _task(g)
    progs = [task.backend.genome.program(c.as_dict()) for c in _genomes(task, 2, seed=4)]
    task.backend.close()
    xs = g.example_inputs(2)
    ref = g.evaluate(*xs)
    for prog in progs:
        plan = CudaPlan(g, prog, DEVICE)
        assert plan.host_steps > 0 and plan.graphed() is None
        (y,) = plan(*xs)
        assert float(np.abs(y - ref[0]).max()) <= tolerance(g, ref)
    # the torch-eager baseline takes the same way round
    (y,) = torchlib.forward(g, DEVICE)(*[torch.from_numpy(x).to(DEVICE) for x in xs])
    assert float(np.abs(y.cpu().numpy() - ref[0]).max()) <= tolerance(g, ref)


def _attention_graph(seq: int = 9, heads: int = 2, dh: int = 16, causal: bool = True, scale: float | None = None):
    """x -> q, k, v projections -> heads -> sdpa -> merged heads -> output projection: attention as one op."""
    from planforge.ir.graph import GraphBuilder

    width = heads * dh
    b = GraphBuilder(f"attn-s{seq}-h{heads}-d{dh}")
    x = b.input("x", (seq, width))

    def heads_of(t: str) -> str:
        return b.op("transpose", b.op("reshape", t, shape=(seq, heads, dh)), perm=(1, 0, 2))

    q, k, v = (heads_of(b.linear(x, width, width, f"attn.{n}")) for n in "qkv")
    ctx = b.op("sdpa", q, k, v, causal=causal, scale=dh ** -0.5 if scale is None else scale)
    y = b.op("reshape", b.op("transpose", ctx, perm=(1, 0, 2)), shape=(seq, width))
    return b.output(b.linear(y, width, width, "attn.o"))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_sdpa_lowers_to_the_flash_attention_template(causal):
    g = _attention_graph(causal=causal)
    task = _task(g)
    progs = [task.backend.genome.program(c.as_dict()) for c in _genomes(task, 3, seed=5)]
    task.backend.close()
    kinds = set()
    for prog in progs:
        kinds |= _check(g, prog)
    assert "attention" in kinds
    att = [s for p in progs for s in p if s["op"] in TEMPLATES and s["problem"]["op"] == "attention"]
    assert {tuple(sorted(s["knobs"])) for s in att} == {("BLOCK_M", "BLOCK_N", "num_stages", "num_warps")}


def test_sdpa_the_template_cannot_run_stays_a_torch_step():
    """A scale other than 1/sqrt(d) (the template's) leaves sdpa to torch's own, still right."""
    g = _attention_graph(causal=False, scale=0.3)
    task = _task(g)
    progs = [task.backend.genome.program(c.as_dict()) for c in _genomes(task, 2, seed=6)]
    task.backend.close()
    for prog in progs:
        assert "attention" not in _check(g, prog)
        assert any(s["op"].startswith("lib") and s["args"][0] == "sdpa" for s in prog)
