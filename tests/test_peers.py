"""A whole imported model measured against the runtimes a user would run it with (``planforge.peers``)."""
import importlib.util

import numpy as np
import pytest

from planforge.ir import from_onnx
from planforge.ir.zoo import policy_mlp
from planforge.peers import model_peers

torch = pytest.importorskip("torch")
nn = torch.nn


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class Residual(nn.Module):
    """Two residual MLP blocks: a cut point between them, so the model partitions into tasks."""

    def __init__(self, width=24):
        super().__init__()
        self.a1, self.a2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.b1, self.b2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        x = x + self.a2(torch.relu(self.a1(x)))
        return x + self.b2(torch.relu(self.b1(x)))


def onnx_file(tmp_path, k=16, n=8):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, k])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    return path, model


def test_an_onnx_models_peers_run_the_file_and_are_checked_against_the_reference(tmp_path):
    pytest.importorskip("onnxruntime")
    path, model = onnx_file(tmp_path)
    g = from_onnx(path)
    assert g.source.kind == "onnx" and g.source.onnx_path == str(path.resolve())
    xs = g.example_inputs(0)
    ref = g.evaluate(*xs)[0]
    peers = {p.name: p for p in model_peers(g, xs, ref, 1e-4, workdir=tmp_path)}
    assert peers["onnxruntime"].run is not None and peers["onnxruntime"].why is None
    assert np.allclose(peers["onnxruntime"].run()[0], ref, atol=1e-4)
    if not installed("openvino"):
        assert peers["openvino"].run is None and "not installed" in peers["openvino"].why
    # a runtime that computes something else is never timed, and says so
    wrong = {p.name: p for p in model_peers(g, xs, ref + 1.0, 1e-4, workdir=tmp_path)}
    assert wrong["onnxruntime"].run is None and "wrong answers" in wrong["onnxruntime"].why
    # an in-memory model: its bytes are written out for the runtimes that need a file
    mem = from_onnx(model)
    assert mem.source.onnx_path is None and mem.source.onnx_bytes
    (tmp_path / "m").mkdir()
    assert {p.name: p for p in model_peers(mem, xs, ref, 1e-4, workdir=tmp_path / "m")}["onnxruntime"].run is not None
    assert (tmp_path / "m" / "model.onnx").is_file()


def test_a_graph_sent_to_another_process_carries_no_module_or_bytes(tmp_path):
    import pickle

    path, model = onnx_file(tmp_path)
    g = pickle.loads(pickle.dumps(from_onnx(model)))
    assert g.source.kind == "onnx" and g.source.onnx_bytes is None
    from planforge.ir import from_torch

    t = pickle.loads(pickle.dumps(from_torch(Residual().eval(), (torch.zeros(1, 24),))))
    assert t.source.kind == "torch" and t.source.module is None


def test_a_zoo_graph_has_no_peers():
    g = policy_mlp(1)
    xs = g.example_inputs(0)
    assert g.source is None and model_peers(g, xs, g.evaluate(*xs)[0], 1e-4) == []


def test_a_partitioned_torch_model_is_timed_against_its_runtimes_end_to_end(tmp_path):
    from planforge.ir import from_torch
    from planforge.search import Budget
    from planforge.spec import load_spec
    from planforge.tuning import tune
    from planforge.workloads.models import graph_workload

    torch.manual_seed(0)
    g = from_torch(Residual().eval(), (torch.randn(2, 24),))
    wl = graph_workload(g, "residual", whole_below=0)
    assert wl.partition is not None
    res = tune(wl, budget=Budget(evals=4), out=tmp_path)
    assert res.ok
    e = res.end_to_end
    assert set(e.peers) == {"onnxruntime", "openvino", "torch eager", "torch.compile"}
    assert e.peers["torch eager"]["median_s"] > 0  # torch is here: the module itself is timed
    assert "not asked for" in e.peers["torch.compile"]["skipped"]
    if installed("onnxruntime") and installed("onnxscript"):
        assert e.peers["onnxruntime"]["median_s"] > 0
    timed = [e.library_median_s] + [v["median_s"] for v in e.peers.values() if "median_s" in v]
    assert e.fastest[1] == min(timed) and e.ratio_vs_fastest == pytest.approx(e.median_s / min(timed))
    import io

    from rich.console import Console

    from planforge.report.summary import print_summary

    buf = io.StringIO()
    print_summary(res, Console(file=buf, width=300))
    text = buf.getvalue()
    assert "against the model's runtimes: " in text and "torch eager " in text and "fastest of all: " in text
    assert "not timed: " in text and "torch.compile (not asked for" in text
    html = (tmp_path / "report.html").read_text()
    assert "Against the model's runtimes" in html and "torch eager " in html and "torch.compile: not timed" in html
    spec = load_spec(tmp_path / "spec.json")  # the schema holds the peers' figures and reasons
    assert spec["end_to_end"]["fastest"]["name"] == e.fastest[0]
    assert set(spec["end_to_end"]["peers"]) == set(e.peers)


def test_peers_option_none_times_none_and_a_bad_one_is_a_clear_error(tmp_path):
    from planforge.ir import from_torch
    from planforge.search import Budget
    from planforge.tuning import tune
    from planforge.workloads.models import graph_workload

    g = from_torch(Residual().eval(), (torch.randn(2, 24),))
    res = tune(graph_workload(g, "residual", options={"peers": "none"}, whole_below=0), budget=Budget(evals=3))
    assert res.ok and res.end_to_end.peers == {}
    with pytest.raises(ValueError, match="peers='sometimes'"):  # before anything is built or measured
        graph_workload(g, "residual", options={"peers": "sometimes"}, whole_below=0)



def test_the_fastest_runner_is_the_library_or_a_timed_peer():
    from planforge.endtoend import EndToEnd

    e = EndToEnd(1e-3, 2e-3, 100, "numpy", 3e-3, 4e-3, peers={
        "onnxruntime": {"median_s": 5e-4, "p99_s": 6e-4, "settings": ""},
        "openvino": {"skipped": "failed to load: [CPU] unsupported", "settings": ""}})
    assert e.fastest == ("onnxruntime", 5e-4) and e.ratio_vs_fastest == pytest.approx(2.0)
    assert e.to_json()["fastest"] == {"name": "onnxruntime", "median_s": 5e-4, "ratio": pytest.approx(2.0)}
    assert EndToEnd(1e-3, 2e-3, 100, "numpy", 3e-3, 4e-3).fastest == ("numpy", 3e-3)
