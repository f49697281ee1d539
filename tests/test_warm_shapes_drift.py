"""bench/warm_shapes.py's drift figure: warm time / cold time of the configurations both runs of a seed measured."""
import importlib.util
from pathlib import Path

from planforge.outcome import Outcome
from planforge.spec.records import Records

BENCH = Path(__file__).resolve().parents[1] / "bench" / "warm_shapes.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("warm_shapes", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(db: Path, times: dict[str, float | None]) -> None:
    with Records(db) as r:
        run, _ = r.start_run("gemm", "gemm:8x8x8", {"budget": len(times)})
        for i, (fp, t) in enumerate(times.items(), 1):
            o = Outcome.measured([t]) if t is not None else Outcome.invalid("runtime", "failed")
            r.add(run, "gemm:8x8x8", "t0", "cpu", fp, {"tile": fp}, o, i)


def test_drift_compares_only_configurations_both_runs_measured(tmp_path):
    ws = load_bench()
    cold, warm = tmp_path / "cold.db", tmp_path / "warm.db"
    write(cold, {"a": 1.0, "b": 2.0, "c": 4.0, "d": None, "only-cold": 1.0})
    write(warm, {"a": 2.0, "b": 1.0, "c": 4.0, "d": 3.0, "only-warm": 1.0})
    assert ws.drift(cold, warm) == {"configs": 3, "min": 0.5, "median": 1.0, "max": 2.0}  # d failed in the cold run
    other = tmp_path / "other.db"
    write(other, {"x": 1.0})
    assert ws.drift(cold, other) is None


def test_remeasure_protocol_interleaves_and_scores_against_remeasured_times(tmp_path):
    ws = load_bench()
    # cold and warm alternate, each configuration once (the one both measured where it first comes)
    assert ws.interleave(["a", "b", "c", "d"], ["x", "b", "y"]) == ["a", "x", "b", "c", "y", "d"]
    cold, warm = tmp_path / "cold.db", tmp_path / "warm.db"
    write(cold, {"a": 5.0, "b": 1.0, "c": None})
    write(warm, {"x": 9.0, "c": 9.0, "b": 9.0})
    with Records(cold) as r:  # what the funnel rejected unmeasured is no evaluation
        r.add("r0", "gemm:8x8x8", "t0", "cpu", "z", {"tile": "z"}, Outcome.rejected("cut by the funnel"), 0)
    order_c, order_w = ws.measured_order(cold), ws.measured_order(warm)
    assert [fp for _, fp, _ in order_c] == ["a", "b", "c"] and [n for n, _, _ in order_w] == [1, 2, 3]
    # scored against the re-measured times, not the runs' own: c (failed in the cold run) now counts for warm
    times = {"a": 2.0, "b": 1.0, "c": 1.04, "x": 3.0}
    assert ws.evals_to(order_c, times, 1.05, 3) == 2 and ws.evals_to(order_w, times, 1.05, 3) == 2
    assert ws.evals_to(order_w, {"x": 3.0}, 1.05, 3) == 4  # never within: budget + 1


def test_alternate_tunes_the_warm_run_first_on_odd_seeds(tmp_path, monkeypatch):
    """--alternate: the run tuned second on a loaded machine sees another load; which side goes first alternates
    with the seed (cold first on even seeds), and without it the cold run always goes first."""
    ws = load_bench()
    order = []

    def fake_tune(workload, shape, budget, seed, out, warm=None):
        order.append((out.name.split("-")[0], seed))
        return {"curve": [(1, 2.0), (2, 1.0)], "evaluations": 2, "strategy": {}, "wall_s": 0.0, "final_s": 1.0,
                "warm_note": [], "warm_stage": None}

    monkeypatch.setattr(ws, "tune", fake_tune)
    monkeypatch.setattr(ws, "drift", lambda cold, warm: None)
    assert ws.main(["--seeds", "2", "--pairs", "0", "--alternate", "--work", str(tmp_path)]) == 0
    assert order == [("src", 0), ("cold", 0), ("warm", 0), ("src", 1), ("warm", 1), ("cold", 1)]
    order.clear()
    assert ws.main(["--seeds", "2", "--pairs", "0", "--work", str(tmp_path)]) == 0
    assert [o for o in order if o[0] != "src"] == [("cold", 0), ("warm", 0), ("cold", 1), ("warm", 1)]
