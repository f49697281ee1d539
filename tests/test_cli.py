import json

from planforge.spec import load_spec


def test_drill_tune_writes_spec_and_summary(cli, tmp_path):
    r = cli("tune", "--workload", "drill", cwd=tmp_path, check=True)
    spec = load_spec(tmp_path / "planforge-out" / "drill" / "spec.json")
    assert spec["manifest"]["workload"] == "drill"
    for part in ("best so far", "ranked top-4", "finalist walk", "Spearman", "break-even", "spec:"):
        assert part in r.stdout, part


def test_issue_command_and_summary(cli, tmp_path):
    r = cli("tune", "--workload", "drill", "--strategy", "genetic", "--budget", "24", "--seed", "0",
            "--out", tmp_path, check=True)
    assert "rank 1 rejected, rank 2 rejected, rank 3 accepted at 103 ns" in r.stdout
    assert "50 consecutive proposals of already-measured candidates" in r.stdout
    assert "pays back after" in r.stdout


def test_the_workload_being_prepared_is_shown_on_a_terminal(cli, tmp_path):
    # before the first evaluation a model's workload takes up to minutes (import, e-graph, kernels measured)
    r = cli("tune", "--workload", "drill", "--budget", "4", "--out", tmp_path, env={"FORCE_COLOR": "1"}, check=True)
    assert "preparing drill (a model: imported, its graph rewritten, its first kernels measured)" in r.stderr
    r = cli("tune", "--workload", "drill", "--budget", "4", "--out", tmp_path, "--quiet", env={"FORCE_COLOR": "1"},
            check=True)
    assert "preparing" not in r.stderr


def test_json_output(cli, tmp_path):
    r = cli("tune", "--workload", "drill", "--strategy", "exhaustive", "--budget", "24", "--out", tmp_path, "--json",
            check=True)
    d = json.loads(r.stdout)
    assert d["ok"] and d["latency_s"] == 103e-9
    t = d["tasks"]["mlp_layer"]
    assert t["evaluations"] == 24 and round(t["proxy_spearman"], 2) == 0.83
    assert [f["rank"] for f in t["rejected"]] == [1, 2]


def test_all_finalists_rejected_is_a_clear_error(cli, tmp_path):
    r = cli("tune", "--workload", "drill", "--strategy", "proxy-topk", "--budget", "3", "--keep", "3", "--out", tmp_path)
    assert r.returncode == 1
    assert "all 3 finalists were rejected" in r.stderr and "fp16 accumulation" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_inputs_give_clear_errors(cli, tmp_path):
    cases = [
        (["tune", "--workload", "nope"], "unknown workload 'nope'"),
        (["tune", "-w", "drill", "--strategy", "nope", "--out", tmp_path], "unknown strategy 'nope'"),
        (["tune", "-w", "drill", "--option", "delay_s=fast", "--out", tmp_path], "expected float"),
        (["tune", "-w", "drill", "--option", "colour=red", "--out", tmp_path], "has no option 'colour'"),
        (["tune", "-w", "drill", "--option", "novalue", "--out", tmp_path], "must look like key=value"),
        (["tune", "-w", "drill", "--budget", "0", "--out", tmp_path], "budget must be positive"),
        (["tune", "-w", "drill", "--keep", "0", "--out", tmp_path], "keep must be at least 1"),
        (["tune", "-w", "drill", "--records", tmp_path, "--out", tmp_path], "is a directory"),
    ]
    for args, msg in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert msg in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_spec_validate_and_show(cli, tmp_path):
    cli("tune", "-w", "drill", "--out", tmp_path, "--quiet", check=True)
    spec = tmp_path / "spec.json"
    r = cli("spec", "validate", spec, check=True)
    assert "is a valid planforge spec" in r.stdout
    r = cli("spec", "show", spec, check=True)
    assert "mlp_layer" in r.stdout and "103 ns" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = cli("spec", "validate", bad)
    assert r.returncode == 1 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_target_option(cli, tmp_path):
    r = cli("tune", "--workload", "drill", "--target", "table", "--strategy", "exhaustive", "--budget", "24",
            "--out", tmp_path, "--json", check=True)
    assert json.loads(r.stdout)["latency_s"] == 103e-9
    assert load_spec(tmp_path / "spec.json")["target"]["backend"] == "table"
    for args, msg in [(["tune", "-w", "drill", "--target", "cpu"], "the drill runs on the 'table' target only"),
                      (["tune", "-w", "gemm", "--target", "nope"],
                       "target 'nope' is not available; known targets: cpu, cuda, replay, table"),
                      (["probe", "--target", "nope"], "target 'nope' is not available"),
                      (["probe", "--target", "table"], "target 'table' has no device of its own to probe")]:
        r = cli(*args, "--out", tmp_path / "x") if args[0] == "tune" else cli(*args)
        assert r.returncode == 2 and msg in r.stderr.replace("\n", " ") and "Traceback" not in r.stderr, (args, r.stderr)
