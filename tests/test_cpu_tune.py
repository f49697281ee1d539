"""Tuning a kernel workload end to end: spec, libraries side by side, the 95% rule."""
import json

import pytest

from planforge.outcome import Outcome
from planforge.search import Ranked, Walk, walk_finalists
from planforge.space import Space, categorical
from planforge.spec import load_spec
from planforge.results import TaskResult


def test_tune_gemm_json_reports_library_side_by_side(cli, tmp_path):
    r = cli("tune", "--workload", "gemm", "--shape", "16,64,48", "--epilogue", "bias_gelu", "--budget", "6",
            "--strategy", "random", "--out", tmp_path, "--json", check=True, timeout=600)
    d = json.loads(r.stdout)
    assert d["ok"] and d["latency_s"] > 0 and d["library_latency_s"] > 0
    assert d["ratio_vs_library"] == pytest.approx(d["latency_s"] / d["library_latency_s"])
    spec = load_spec(tmp_path / "spec.json")
    t = next(iter(spec["tasks"].values()))
    assert "numpy" in t["baselines"] and t["ratio_vs_baseline"] == pytest.approx(d["ratio_vs_library"])
    assert (t["fallback"] is None) == (t["selected"] == "tuned")
    assert spec["target"]["backend"] == "cpu" and spec["manifest"]["options"]["dims"] == [16, 64, 48]


def test_gemm_m1_takes_the_gemv_template(cli, tmp_path):
    r = cli("tune", "--workload", "gemm", "--shape", "1,64,64", "--budget", "3", "--strategy", "random",
            "--out", tmp_path, "--quiet", check=True, timeout=600)
    spec = load_spec(tmp_path / "spec.json")
    assert spec["manifest"]["workload"] == "gemv" and "w_layout" in next(iter(spec["tasks"].values()))["plan"]
    assert "tuned / best library" in r.stdout


def test_bad_kernel_workload_options(cli, tmp_path):
    for args, msg in [(["--shape", "1,2"], "expected 3 positive integers"),
                      (["--shape", "a,b,c"], "expected 3 positive integers"),
                      (["--epilogue", "swish"], "unknown epilogue")]:
        r = cli("tune", "--workload", "gemm", *args, "--out", tmp_path)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_missing_compiler_through_the_cli(cli, tmp_path):
    r = cli("tune", "--workload", "softmax", "--budget", "2", "--out", tmp_path,
            env={"CC": "no-such-cc-xyz", "PLANFORGE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 2 and "no C compiler" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _result(tuned_s, libs):
    s = Space([categorical("x", ("a",))])
    c = next(s.enumerate())
    ranked = Ranked(1)
    ranked.insert(tuned_s, c)
    walk = walk_finalists(ranked, [])
    task = type("T", (), {"weight": 1, "cost_model": None})()
    return TaskResult(task, None, walk, {"name": "x"}, ranked=ranked,
                      baselines={k: Outcome.measured([v]) for k, v in libs.items()})


def test_95_percent_rule():
    ok = _result(1.04e-3, {"numpy": 1.0e-3, "torch": 1.2e-3})  # 96% of numpy's speed: kept
    assert ok.best_library == ("numpy", 1.0e-3) and ok.fallback is None and ok.selected_latency == 1.04e-3
    slow = _result(1.10e-3, {"numpy": 1.0e-3})  # 91%: falls back
    assert slow.fallback["to"] == "numpy" and "95% rule" in slow.fallback["reason"]
    assert slow.selected_latency == 1.0e-3
    none = _result(1.0e-3, {})
    assert none.fallback is None and none.ratio_vs_library is None
