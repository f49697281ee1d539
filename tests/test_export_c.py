"""The C export: a tuned plan as plan.h + libplan.so + libplan.a + main.c, built with the system compiler,
run without Python (its own C main) and through ctypes, giving the Python plan's answer."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from planforge.spec.export_c import CExportError, export_c

sys.path.insert(0, os.path.dirname(__file__))
from test_batch1 import close, mlp_plan  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="needs a C compiler")


def _main(folder, x):
    (folder / "in.bin").write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
    p = subprocess.run([str(folder / "plan_main"), "-n", "300", "-r", "3", "-i", str(folder / "in.bin"), "-o",
                        str(folder / "out.bin")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout, np.frombuffer((folder / "out.bin").read_bytes(), np.float32)


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("threads,splits", [(1, ["n", "n", "n"]), (2, ["k", "n", "k"]), (2, ["n", "k", "n"])])
def test_exported_library_matches_the_python_plan(tmp_path, isa, threads, splits):
    from planforge.targets.cpu.build import IsaError, isa_flags

    try:
        isa_flags(isa)
    except IsaError as e:
        pytest.skip(str(e))
    g, plan = mlp_plan((19, 37, 23, 5), threads=threads, splits=splits)
    (x,) = g.example_inputs(3)
    want = plan(x)[0]
    close(want, g.evaluate(x)[0])
    e = export_c(plan, tmp_path, spec={"manifest": {"workload": "test-mlp"}, "target": {"fingerprint": "here"}},
                 isa=isa)
    names = {p.name for p in e.files}
    assert {"plan.h", "plan.c", "main.c", "Makefile", "libplan.so", "libplan.a", "plan_main"} <= names
    assert (e.in_size, e.out_size) == (19, 5)
    head = (tmp_path / "plan.h").read_text()
    assert "int plan_run(const float *in, float *out);" in head and "#define PLAN_IN_SIZE 19" in head
    # the C main: no Python in the process
    text, got = _main(tmp_path, x)
    assert "median_ns_per_call" in text and "test-mlp" in text
    close(got.reshape(want.shape), g.evaluate(x)[0])
    assert np.allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    # the shared library through ctypes: create, run, destroy, create again
    lib = ctypes.CDLL(str(tmp_path / "libplan.so"))
    lib.plan_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    y = np.zeros(5, np.float32)
    assert lib.plan_run(x.ctypes.data, y.ctypes.data) == -1  # before plan_create: refused, not a crash
    for _ in range(2):
        assert lib.plan_create() == 0
        for _ in range(50):
            y[:] = 0
            assert lib.plan_run(x.ctypes.data, y.ctypes.data) == 0
        assert np.allclose(y.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
        lib.plan_destroy()
    # nothing of Python or OpenMP linked in
    if shutil.which("ldd"):
        deps = subprocess.run(["ldd", str(tmp_path / "libplan.so")], capture_output=True, text=True).stdout
        assert "python" not in deps and "gomp" not in deps


def test_makefile_rebuilds(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    g, plan = mlp_plan((8, 16, 3), threads=2, splits=["k", "n"])
    export_c(plan, tmp_path, build=False)
    assert not (tmp_path / "libplan.so").exists()
    p = subprocess.run(["make", "-s"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (x,) = g.example_inputs(0)
    _, got = _main(tmp_path, x)
    assert np.allclose(got, plan(x)[0].ravel(), rtol=1e-5, atol=1e-6)


def test_plans_that_are_not_one_fused_mlp_are_refused(tmp_path):
    from planforge.ir.zoo import policy_mlp
    from planforge.targets.cpu import CpuTarget

    g = policy_mlp(1, (8, 16, 3))
    with pytest.raises(CExportError, match="numpy baseline"):
        export_c(CpuTarget().plan(g, None), tmp_path)


def test_cli_export(cli, tmp_path):
    """``planforge export`` on a tuned model spec: the files, or the reason the plan cannot be exported."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((12, 20)).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    w2, b2 = rng.standard_normal((20, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    m = helper.make_model(helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "mlp.onnx"
    onnx.save(m, str(path))
    cli("tune", "-w", path, "--budget", "3", "--out", tmp_path / "run", "--quiet", check=True, timeout=600)
    r = cli("export", tmp_path / "run" / "spec.json", "--format", "c", "-o", tmp_path / "c", timeout=600)
    import json

    prog = json.loads((tmp_path / "run" / "spec.json").read_text())["tasks"]["graph"]["program"]
    if any(s["op"] == "fused_mlp" for s in prog):
        assert r.returncode == 0, r.stderr
        assert "libplan.so" in r.stdout and (tmp_path / "c" / "plan_main").is_file()
        x = rng.standard_normal((1, 12)).astype(np.float32)
        _, got = _main(tmp_path / "c", x)
        want = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        assert np.allclose(got, want.ravel(), rtol=1e-4, atol=1e-4)
    else:  # the search chose library steps: the export says so
        assert r.returncode != 0 and "one fused MLP" in r.stderr
    bad = cli("export", tmp_path / "run" / "spec.json", "--format", "t4", "-o", tmp_path / "t4")
    assert bad.returncode == 2 and "records export" in bad.stderr
