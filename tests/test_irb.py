"""The inverted-residual block as one kernel (issue 14, MobileNetV2): the template against its reference on shapes no
block divides (ring and whole-map forms, row bands and channel groups, stride 2, 5x5, without expansion, with the
residual), its problems' checks, the rules that find the block in a convolutional e-graph, plans of a small
MobileNetV2-like network that run its blocks as single kernels, and the network tuned end to end."""
import numpy as np
import pytest

from planforge.ops import REGISTRY
from planforge.ops.irb import pack_ref
from planforge.rewrite import saturate
from planforge.rewrite.analysis import analyse
from planforge.rewrite.partition import partition
from planforge.targets.cpu.templates import TEMPLATES, Problem, ProblemError, limits, make_inputs, reference
from planforge.targets.cpu.templates.irb import FACTS

from test_cpu_kernels import assert_candidates_correct, sample_knobs

torch = pytest.importorskip("torch")
nn = torch.nn

RULES = ["epilogue", "layout", "algebra"]
PROBLEMS = [Problem("irb", (1, 7, 5, 6, 40, 6, 3, 1), "relu6/relu6/add"),
            Problem("irb", (1, 9, 11, 5, 24, 7, 3, 2), "hardswish/relu/none"),
            Problem("irb", (1, 6, 7, 24, 24, 9, 5, 1), "copy/relu6/none"),
            Problem("irb", (2, 5, 5, 8, 48, 19, 5, 2), "relu/hardswish/none")]


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: f"{p.dims}-{p.epilogue}")
def test_every_sampled_setting_matches_the_reference(profile, p):
    """Sampled settings of both forms (a ring of rows, the whole map) and both splits, on maps, channel counts and
    pixel counts that no register tile divides."""
    space = TEMPLATES["irb"].space(p, limits(profile))
    cands = sample_knobs(space, 400, seed=5)
    pick = [[c for c in cands if c["whole"] == 1 and c["pf"] == q][:2] for q in (0, 1)]
    pick = pick[0] + pick[1] + [c for c in cands if c["whole"] == 0][:4]
    pick += [space.nearest_valid(TEMPLATES["irb"].defaults(p, limits(profile)))]
    if profile.physical_cores >= 2:
        pick += [c for c in cands if c["threads"] == 2 and c["split"] == "e"][:2]
        pick += [c for c in cands if c["threads"] == 2 and c["split"] == "h"][:2]
    assert {c["whole"] for c in pick} == {0, 1} and {c["pf"] for c in pick} == {0, 1}
    assert assert_candidates_correct(p, profile, pick) == len(pick)


def test_only_a_whole_map_prefetches_its_weights(profile):
    """``pf`` prefetches the weight streams of a whole-map block (each weight read once a call), and the space
    has no ``pf`` for the row-by-row form (its weights are read once a row, from the caches after the first)."""
    p = PROBLEMS[0]
    space = TEMPLATES["irb"].space(p, limits(profile))
    base = TEMPLATES["irb"].defaults(p, limits(profile))
    src = {}
    for whole, pf in ((1, 1), (1, 0), (0, 0)):
        k = space.nearest_valid({**base, "whole": whole, "pf": pf, "threads": 1, "split": "h"}, 3,
                                keep=("whole", "pf", "threads"))
        assert (k["whole"], k["pf"]) == (whole, pf)
        src[whole, pf] = TEMPLATES["irb"].source(p, k.as_dict())
    assert "__builtin_prefetch" in src[1, 1] and "__builtin_prefetch" not in src[1, 0] + src[0, 0]
    assert not space.is_valid(space.make({**base, "whole": 0, "pf": 1, "threads": 1, "split": "h"}))


def test_library_baselines_match_the_reference():
    for p in PROBLEMS:
        inp = make_inputs(p, 2)
        want = reference(p, inp)
        for make in (FACTS.numpy, FACTS.torch):
            out = np.empty(want.shape, np.float32)
            make(p, inp, out)()
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dims, epilogue", [
    ((1, 6, 6, 8, 16, 8, 4, 1), "relu6/relu6/none"),     # an even kernel
    ((1, 6, 6, 8, 16, 8, 3, 3), "relu6/relu6/none"),     # stride 3
    ((1, 6, 6, 8, 16, 8, 3, 2), "relu6/relu6/add"),      # a residual that changes shape
    ((1, 6, 6, 8, 16, 8, 3, 1), "copy/relu6/none"),      # no expansion, yet C != E
    ((1, 6, 6, 8, 16, 8, 3, 1), "relu6/relu6"),          # a field missing
    ((1, 6, 6, 8, 16, 8, 3, 1), "gelu:erf/relu6/none"),  # no such activation
])
def test_problems_the_template_does_not_run_are_refused(dims, epilogue):
    with pytest.raises(ProblemError):
        Problem("irb", dims, epilogue)


def test_the_op_equals_the_three_convolutions_it_fuses():
    """``irb_nhwc``'s reference against the chain it replaces, by the ops' own references: the expansion and the
    projection as pointwise GEMMs, the depthwise convolution as ``conv_act_nhwc``."""
    rng = np.random.default_rng(0)
    C, E, O = 4, 12, 4
    x = rng.standard_normal((1, 5, 6, C))
    w1, b1 = rng.standard_normal((C, E)), rng.standard_normal(E)
    wd, bd = rng.standard_normal((E, 1, 3, 3)), rng.standard_normal(E)
    w2, b2 = rng.standard_normal((E, O)), rng.standard_normal(O)
    geo = "3,3,1,1,1,1,1,1,1,1,12"
    R = REGISTRY
    h = R["pw_gemm"].reference([x, w1, b1], {"act": "relu6"})
    h = R["conv_act_nhwc"].reference([h, wd, bd], R["conv_act_nhwc"].from_egg(geo + ";relu6"))
    want = R["pw_gemm"].reference([h, w2, b2], {"act": "none"}) + x
    pack = pack_ref([R["gemm_pack"].reference([w1, b1], {}), R["conv_pack"].reference([wd, bd], {}),
                     R["gemm_pack"].reference([w2, b2], {})], {})
    got = R["irb_nhwc"].reference([x, pack], {"attr": f"relu6|{geo};relu6|add"})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="depthwise"):  # a dilated window is left to the separate kernels
        R["irb_nhwc"].shape([x.shape, pack.shape], {"attr": "relu6|3,3,1,1,1,1,1,1,2,2,12;relu6|add"})


def _net():
    from test_cnn import _Inverted, _randomise_bn

    torch.manual_seed(0)
    return _randomise_bn(nn.Sequential(_Inverted(4, 4, 1, t=1), _Inverted(4, 8, 2), _Inverted(8, 8, 1)))


def test_the_rules_find_every_block_with_and_without_expansion_and_residual():
    from planforge.ir import from_torch

    g = from_torch(_net(), (torch.randn(1, 4, 12, 12),))
    found = set()
    for p in partition(g, whole_below=0).parts:
        eg = saturate(p.graph, RULES)
        a = analyse(eg, p.graph)
        for n in (n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[0] == "irb_nhwc"):
            assert n.id not in a.unavailable
            found.add((a.problem(n).dims, a.problem(n).epilogue))
    assert ((1, 12, 12, 4, 4, 4, 3, 1), "copy/relu6/none") in found      # the block without expansion
    assert ((1, 12, 12, 4, 12, 8, 3, 2), "relu6/relu6/none") in found    # stride 2, no residual
    assert ((1, 6, 6, 8, 24, 8, 3, 1), "relu6/relu6/add") in found       # the residual block


def test_plans_that_run_the_blocks_as_single_kernels_compute_the_network():
    """Every seed plan of the network as one task (the ILP's, priced by the roofline, fuses each block) runs
    correctly, twice on different inputs (nothing stale in a kernel's ring or map between calls)."""
    from planforge.ir import from_torch
    from planforge.targets.registry import get_target
    from planforge.workloads.models import graph_workload

    m = _net()
    x = torch.randn(1, 4, 12, 12)
    g = from_torch(m, (x,))
    (task,) = graph_workload(g, "mobile", whole_below=10_000, kernel_trials=2).tasks
    used = set()
    for c in task.seeds:
        prog = task.backend.genome.program(c.as_dict())
        used |= {s["args"][0] for s in prog if s["args"] and s["op"].startswith("tmpl")}
        plan = get_target("cpu").plan(g, prog)
        for xi in (x, torch.randn(1, 4, 12, 12)):
            want = m(xi).detach().numpy()
            assert np.abs(plan(xi.numpy())[0] - want).max() < 1e-4 * (1 + np.abs(want).max())
    assert "irb_nhwc" in used, used


def test_a_small_mobilenet_like_network_tuned_at_a_tiny_budget_runs_correctly(tmp_path):
    import planforge

    m = _net()
    x = torch.randn(1, 4, 12, 12)
    res = planforge.tune(m, example_inputs=(x,), budget=2, out=tmp_path / "t")
    for xi in (x, torch.randn(1, 4, 12, 12)):
        want = m(xi).detach().numpy()
        assert np.abs(res.plan(xi.numpy())[0] - want).max() < 1e-4 * (1 + np.abs(want).max())


def test_kernels_sharing_the_per_thread_scratch_leave_each_other_correct_padding(profile):
    """Every inverted-residual kernel opened as a plan opens it takes the process's per-thread scratch: one whose
    interior covers another's padding runs in between, and the other still reads zeros there."""
    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.templates.parfor import open_library

    small = Problem("irb", (1, 4, 4, 6, 24, 6, 3, 1), "relu6/relu6/add")
    big = Problem("irb", (1, 9, 9, 5, 40, 7, 3, 1), "hardswish/relu6/none")
    runs = []
    for p in (small, big):
        space = TEMPLATES["irb"].space(p, limits(profile))
        for whole in (1, 0):
            k = space.nearest_valid({**TEMPLATES["irb"].defaults(p, limits(profile)), "whole": whole, "pf": 0,
                                     "threads": 1}, 3, keep=("whole", "threads"))
            lib = open_library(build(TEMPLATES["irb"].source(p, k.as_dict())).path)
            inp = make_inputs(p, 4)
            out = np.empty(reference(p, inp).shape, np.float32)
            runs.append((TEMPLATES["irb"].bind(lib, p, k.as_dict(), inp, out), out, reference(p, inp)))
    for _ in range(2):
        for run, out, want in runs + runs[::-1]:
            out[:] = np.nan
            run()
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_block_without_expansion_reads_no_stale_scratch_past_its_channels(profile):
    """A block without expansion copies its input's channels into the scratch; its last block of channels runs past
    them (40 channels in blocks of 48, or of 24), and those lanes are zeroed, not left as the shared scratch held
    them: a NaN left there by another kernel, times a zero weight, would be NaN."""
    import ctypes

    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.templates import parfor
    from planforge.targets.cpu.templates.parfor import open_library

    p = Problem("irb", (1, 5, 6, 40, 40, 8, 3, 1), "copy/hardswish/none")  # relu6 would turn a NaN into 0
    space = TEMPLATES["irb"].space(p, limits(profile))
    inp = make_inputs(p, 6)
    want = reference(p, inp)
    pool = parfor._shared()[0]
    pool.pf_pool_scratch.restype = ctypes.c_void_p
    pool.pf_pool_scratch.argtypes = [ctypes.c_size_t]
    for whole in (0, 1):
        k = space.nearest_valid({**TEMPLATES["irb"].defaults(p, limits(profile)), "nv1": 3, "whole": whole,
                                 "pf": 0, "threads": 1}, 3, keep=("nv1", "whole", "pf", "threads"))
        assert k is not None and k["whole"] == whole and 40 % (k["nv1"] * k["vec"])
        lib = open_library(build(TEMPLATES["irb"].source(p, k.as_dict())).path)
        out = np.empty(want.shape, np.float32)
        run = TEMPLATES["irb"].bind(lib, p, k.as_dict(), inp, out)
        n = 1 << 16
        np.ctypeslib.as_array((ctypes.c_float * n).from_address(pool.pf_pool_scratch(n)))[:] = np.nan
        run()
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
