"""Export of the records database to T4 and Kernel Tuner cache files, read back by the replay backend."""
import json

import pytest

from planforge.targets.replay.formats import read_recording
from planforge.targets.replay.replay import load_replay
from planforge.outcome import Outcome
from planforge.search import Budget
from planforge.spec import Records
from planforge.spec.export import ExportError, export_records
from planforge.tuning import tune
from planforge.workloads import load_workload

OUTCOMES = {
    (16, "row"): Outcome.measured([2e-6, 1e-6, 3e-6]),
    (16, "col"): Outcome.measured([5e-6]),
    (32, "row"): Outcome.invalid("timeout", "took too long"),
    (32, "col"): Outcome.invalid("correctness", "max error 3e-2"),
    (64, "row"): Outcome.invalid("compile", "nvcc: error"),
    (64, "col"): Outcome.rejected("violates: tile * 4 <= 128"),
}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "records.db"
    with Records(path) as r:
        run, _ = r.start_run("synth", "wk", {"strategy": "random"})
        for i, ((tile, order), o) in enumerate(OUTCOMES.items(), start=1):
            r.add(run, "wk", "gemm", "cpu:abc", f"fp{i}", {"tile": tile, "order": order}, o, i)
    return path


@pytest.mark.parametrize("fmt,name", [("t4", "out.json"), ("kernel_tuner", "out.json.gz")])
def test_export_round_trips_every_outcome(db, tmp_path, fmt, name):
    e = export_records(db, fmt, tmp_path / name)
    assert (e.rows, e.task, e.target) == (6, "gemm", "cpu:abc")
    rec = read_recording(e.path, t1=None)
    assert rec.format == fmt and rec.names == ("order", "tile")  # the records keep configurations in key order
    got = {(cfg[1], cfg[0]): o for cfg, o in rec.entries.items()}
    for cfg, o in OUTCOMES.items():
        back = got[cfg]
        if o.ok:
            assert back.ok and back.times == pytest.approx(o.times) and back.metric == pytest.approx(o.metric)
        else:
            assert back.category == o.category  # the exact category survives, Kernel Tuner caches included
    r = load_replay(e.path, t1=None)
    assert r.optimum == pytest.approx(2e-6)
    assert len(r.space.valid_ints()) == 5  # the rejected configuration is outside the space


def test_kernel_tuner_cache_has_kernel_tuner_fields(db, tmp_path):
    doc = json.loads(export_records(db, "kernel_tuner", tmp_path / "c.json").path.read_text())
    assert doc["tune_params_keys"] == ["order", "tile"] and doc["tune_params"] == {"tile": [16, 32, 64],
                                                                                   "order": ["col", "row"]}
    rec = doc["cache"]["row,16"]
    assert rec["time"] == pytest.approx(2e-3) and rec["times"] == pytest.approx([2e-3, 1e-3, 3e-3])  # ms
    assert doc["cache"]["row,64"]["time"] == "CompilationFailedConfig"
    assert doc["cache"]["col,64"]["time"] == "InvalidConfig"
    t4 = json.loads(export_records(db, "t4", tmp_path / "t.json").path.read_text())
    assert t4["schema_version"] == "1.0.0" and t4["metadata"] == {"timeunit": "milliseconds"}
    for res in t4["results"]:
        assert {"configuration", "times", "invalidity", "correctness"} <= set(res)


def test_export_of_a_tuning_run_replays_to_its_best(tmp_path):
    r = tune(load_workload("drill"), strategy="exhaustive", budget=Budget(evals=24), out=tmp_path)
    e = export_records(tmp_path / "records.db", "kernel_tuner", tmp_path / "drill.json")
    rep = load_replay(e.path, t1=None)
    assert e.rows == 24 and rep.optimum == pytest.approx(min(x.outcome.metric for x in r.tasks[0].result.trials))


def test_export_errors(db, tmp_path):
    with Records(db) as r:
        run, _ = r.start_run("synth", "wk", {"strategy": "other"})
        r.add(run, "wk", "softmax", "cpu:abc", "fpx", {"n": 1}, Outcome.measured([1e-6]), 1)
        r.add(run, "wk", "gemm", "cpu:zzz", "fpy", {"tile": 16, "order": "row"}, Outcome.measured([1e-6]), 2)
    with pytest.raises(ExportError, match="several tasks \\(gemm, softmax\\); choose one with --task"):
        export_records(db, "t4", tmp_path / "x.json")
    with pytest.raises(ExportError, match="several targets"):
        export_records(db, "t4", tmp_path / "x.json", task="gemm")
    assert export_records(db, "t4", tmp_path / "x.json", task="gemm", target="cpu:abc").rows == 6
    with pytest.raises(ExportError, match="unknown export format 'csv'"):
        export_records(db, "csv", tmp_path / "x.csv")
    with pytest.raises(ExportError, match="no such records database"):
        export_records(tmp_path / "none.db", "t4", tmp_path / "x.json")


def test_cli_records_export(cli, db, tmp_path):
    r = cli("records", "export", db, "--format", "t4", "-o", tmp_path / "o.json", check=True)
    assert "wrote 6 configurations of task gemm on cpu:abc" in r.stdout
    assert read_recording(tmp_path / "o.json", t1=None).format == "t4"
    r = cli("records", "export", db, "--format", "xml", "-o", tmp_path / "o.xml")
    assert r.returncode == 2 and "unknown export format 'xml'" in r.stderr and "Traceback" not in r.stderr
