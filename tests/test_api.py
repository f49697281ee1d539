"""The Python API: planforge.tune -> spec -> planforge.load -> call, planforge.compile, manifest checks."""
import json

import numpy as np
import pytest

import planforge
from planforge.api import PlanMismatch

torch = pytest.importorskip("torch", reason="the torch extra is needed to tune a torch module")
try:
    from planforge.ir import from_torch  # noqa: F401
except ImportError:
    pytest.skip("planforge.ir.from_torch (the torch importer, ir/torch_import.py) is not in this checkout yet",
                allow_module_level=True)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(1, 32)
    res = planforge.tune(m, example_inputs=(x,), budget=3, out=tmp_path_factory.mktemp("mlp"))
    return m, x, res


def test_tune_spec_load_call_round_trip(tuned):
    m, x, res = tuned
    assert res.ok and res.spec["manifest"]["shapes"] == {"x": [1, 32]}
    assert res.spec_path.is_file() and res.report_path.is_file() and res.report_path.name == "report.html"
    with torch.no_grad():
        want = m(x)
    out = res.plan(x)  # torch in, torch out
    assert isinstance(out, torch.Tensor) and out.shape == want.shape
    assert torch.allclose(out, want, atol=1e-4)
    # from the spec file alone: weights from the module's graph, knobs from the spec; numpy in, numpy out
    from planforge.ir import from_torch

    plan = planforge.load(res.spec_path, graph=from_torch(m, (x,)))
    y = plan(x.numpy())
    assert isinstance(y, np.ndarray) and np.allclose(y, want.numpy(), atol=1e-4)


def test_compile_with_spec_and_mismatched_inputs(tuned):
    m, x, res = tuned
    f = planforge.compile(m, spec=res.spec_path)
    assert torch.allclose(f(x), m(x).detach(), atol=1e-4)
    with pytest.raises(PlanMismatch, match=r"shape \(1, 16\).*tuned for \(1, 32\)"):
        f(torch.randn(1, 16))
    with pytest.raises(PlanMismatch, match="dtype float64.*tuned for fp32"):
        f(x.double())
    g = planforge.compile(m, example_inputs=torch.randn(2, 32), spec=res.spec_path)
    with pytest.raises(PlanMismatch, match=r"no longer match|tuned for"):
        g(torch.randn(2, 32))


def test_spec_from_another_machine_is_refused(tuned, tmp_path):
    m, x, res = tuned
    d = json.loads(res.spec_path.read_text())
    d["target"]["fingerprint"] = "0000000000000000"
    other = tmp_path / "spec.json"
    other.write_text(json.dumps(d))
    with pytest.raises(PlanMismatch, match="was tuned on device 0000000000000000"):
        planforge.compile(m, spec=other)(x)
    # check_device=False runs it anyway
    assert planforge.compile(m, spec=other, check_device=False)(x).shape == (1, 16)


def test_compile_tunes_on_first_use_and_retunes_on_request(tmp_path):
    torch.manual_seed(1)
    m = MLP()
    f = planforge.compile(m, budget=2, out=tmp_path / "first")
    assert f.plan is None  # nothing tuned until called
    x = torch.randn(1, 32)
    assert torch.allclose(f(x), m(x).detach(), atol=1e-4)
    assert f.result is not None and (tmp_path / "first" / "spec.json").is_file()
    g = planforge.compile(m, spec=f.spec_path, retune=True, budget=2, out=tmp_path / "second")
    x2 = torch.randn(3, 32)
    assert torch.allclose(g(x2), m(x2).detach(), atol=1e-4)
    assert g.result.spec["manifest"]["shapes"] == {"x": [3, 32]}


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="needs example_inputs"):
        planforge.tune(MLP())
    with pytest.raises(ValueError, match="target 'tpu' is not available"):
        planforge.tune("drill", target="tpu")
    with pytest.raises(TypeError, match="takes a workload name"):
        planforge.tune(42)
