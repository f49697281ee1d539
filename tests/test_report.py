"""The HTML report, run.json, `planforge report` and `planforge spec diff`."""
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from planforge.report.html import render, write_report
from planforge.report.run import RunError, load_run
from planforge.search import Budget
from planforge.spec.diff import diff_specs
from planforge.spec import load_spec
from planforge.tuning import tune
from planforge.workloads import load_workload

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def _drill(out, seed=0, **kw):
    return tune(load_workload("drill", {}), strategy="genetic", budget=Budget(evals=24), seed=seed, out=out, **kw)


@pytest.fixture(scope="module")
def drill_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("drill")
    res = _drill(out, command="planforge tune --workload drill")
    assert res.report_path == out / "report.html"
    return out


@pytest.fixture(scope="module")
def cpu_dir(tmp_path_factory):
    """A real CPU tuning run: a small GEMM measured on this machine, with numpy (and torch) beside it."""
    out = tmp_path_factory.mktemp("gemm")
    wl = load_workload("gemm", {"shape": "8,32,32"})
    res = tune(wl, strategy="random", budget=Budget(evals=3), out=out)
    assert res.ok
    return out


def test_tune_writes_run_json_and_report_and_keeps_the_spec_reproducible(drill_dir, tmp_path):
    run = load_run(drill_dir)
    t = run["tasks"]["mlp_layer"]
    assert run["command"] == "planforge tune --workload drill" and run["spec"] == "spec.json"
    ns = [x["n"] for x in t["trials"] if x["n"]]
    assert ns == list(range(1, t["evaluations"] + 1))
    walls = [x["wall_s"] for x in t["trials"]]
    assert walls == sorted(walls) and walls[-1] > 0
    assert t["stop_reason"] and t["accepted_rank"] == 3 and [r["rank"] for r in t["rejected"]] == [1, 2]
    assert t["proxy"]["name"] and all(x["proxy"] is not None for x in t["trials"] if x["status"] == "measured")
    assert run["environment"]["toolchain"]["planforge"] == run["planforge_version"]
    # the spec leaves wall times out: a second identical run writes the same bytes
    _drill(tmp_path, command="something else")
    assert (tmp_path / "spec.json").read_bytes() == (drill_dir / "spec.json").read_bytes()
    assert "wall_s" not in (tmp_path / "spec.json").read_text()


def test_drill_report_html_has_plots_tables_and_nothing_external(drill_dir):
    html = (drill_dir / "report.html").read_text()
    assert not EXTERNAL.search(html) and "http://" not in html and "https://" not in html
    for part in ("plot-curve-mlp_layer", "plot-proxy-mlp_layer", "plot-funnel-mlp_layer", "chosen-table",
                 "environment-table", "Break-even"):
        assert part in html, part
    assert html.count("<svg ") >= 2 and "<script" not in html and "data:image/png" not in html
    # the walk: ranks 1 and 2 are rejected for fp16 accumulation, rank 3 accepted
    assert html.count(">rejected</span>") == 2 and "fp16 accumulation" in html and ">accepted</span>" in html
    assert "a table workload" in html  # the drill has no FLOP count: the roofline says why it is absent


def test_a_failed_run_still_gets_a_report(tmp_path):
    # proxy-topk with 3 evaluations measures only fp16 plans, which validation rejects
    res = tune(load_workload("drill", {}), strategy="proxy-topk", budget=Budget(evals=3), keep=3, out=tmp_path)
    assert not res.ok and not (tmp_path / "spec.json").exists()
    html = res.report_path.read_text()
    assert "no valid finalist" in html and html.count(">rejected</span>") == 3 and ">failed<" in html
    assert load_run(tmp_path)["spec"] is None


def test_cpu_report_has_roofline_and_library_ratio(cpu_dir):
    run = load_run(cpu_dir)
    (key, t), = run["tasks"].items()
    assert t["work"]["flops"] > 0 and t["best_library"][0] in t["baselines"]
    assert run["environment"]["targets"][key]["profile"]["peak_flops_all"] > 0
    html = (cpu_dir / "report.html").read_text()
    assert f"plot-roofline-{key}" in html and "No roofline" not in html
    assert re.search(r"\d+\.\dx (faster|slower) than (numpy|torch)", html)
    assert not EXTERNAL.search(html)


def test_report_command_rerenders_and_refuses_a_folder_without_a_run(cli, drill_dir, tmp_path):
    out = tmp_path / "again.html"
    r = cli("report", drill_dir, "--out", out, check=True)
    assert "mlp_layer" in r.stdout and out.read_text() == render(load_run(drill_dir))
    r = cli("report", tmp_path)
    assert r.returncode == 1 and "holds no run.json" in r.stderr
    r = cli("tune", "--workload", "drill", "--budget", "4", "--out", tmp_path / "t", "--json", check=True)
    assert json.loads(r.stdout)["report"] == str(tmp_path / "t" / "report.html")
    assert (tmp_path / "t" / "report.html").is_file() and (tmp_path / "t" / "run.json").is_file()
    r = cli("report", tmp_path / "nowhere")
    assert r.returncode == 1 and "no such folder" in r.stderr
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(RunError, match="not readable as JSON"):
        write_report(tmp_path)


def test_spec_diff(cli, drill_dir, tmp_path):
    spec = drill_dir / "spec.json"
    r = cli("spec", "diff", spec, spec, check=True)
    assert "no differences" in r.stdout
    assert diff_specs(load_spec(spec), load_spec(spec)) == []
    # another plan and a slower latency: both show, plan first, with the relative change
    d = json.loads(spec.read_text())
    t = d["tasks"]["mlp_layer"]
    t["plan"]["w_layout"] = "row"
    t["latency_s"] *= 1.5
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(d, indent=2, sort_keys=True))
    r = cli("spec", "diff", spec, changed)
    assert r.returncode == 1, r.stderr
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("~")]
    assert lines[0] == "~ tasks.mlp_layer.plan.w_layout: col -> row"
    assert lines[1].startswith("~ tasks.mlp_layer.latency_s:") and lines[1].endswith("(+50.0%)")
    r = cli("spec", "diff", spec, changed, "--json")
    assert [c["path"] for c in json.loads(r.stdout)] == ["tasks.mlp_layer.plan.w_layout", "tasks.mlp_layer.latency_s"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = cli("spec", "diff", spec, bad)
    assert r.returncode == 2 and "not valid JSON" in r.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(args, timeout=90):
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout)


SHOT_HEIGHT = 9000
SUMMARY_BG, SUMMARY_EDGE, BEST_LINE = (245, 249, 255), (31, 95, 168), (161, 74, 0)  # the stylesheet's and svg.py's


def _near(px, rgb, tol=6):
    return all(abs(a - b) <= tol for a, b in zip(px, rgb))


def _rows_with(img, rgb, min_count=20, step=2, tol=6):
    """The pixel rows of ``img`` holding at least ``min_count`` pixels of colour ``rgb`` (every ``step``-th row
    and column looked at)."""
    w, h = img.size
    data = img.load()
    return [y for y in range(0, h, step) if sum(_near(data[x, y], rgb, tol) for x in range(0, w, step)) >= min_count // step]


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    from test_report_summary import synthetic_run

    out = tmp_path_factory.mktemp("synthetic")
    (out / "report.html").write_text(render(synthetic_run()))
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's chromium package)")
@pytest.mark.parametrize("width", [800, 1400])
@pytest.mark.parametrize("which", ["drill_dir", "cpu_dir", "synthetic_dir"])
def test_report_renders_in_headless_chromium(which, width, request, tmp_path):
    """Screenshots at a narrow and a wide window: the summary box comes first and fits the width, the plots
    are drawn (the best-so-far line's colour is on the page), nothing is fetched and no script runs."""
    folder = request.getfixturevalue(which)
    url = (folder / "report.html").resolve().as_uri()
    shot = tmp_path / "report.png"
    # tall enough that the plots are on it however many warnings a busy machine adds above them
    p = _chromium([f"--screenshot={shot}", f"--window-size={width},{SHOT_HEIGHT}", url])
    assert shot.is_file() and shot.stat().st_size > 20_000, p.stderr[-2000:]
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (width, SHOT_HEIGHT)
    # rows showing the box's background (its padding shows on both sides of a warning that spans the box)
    rows = _rows_with(img, SUMMARY_BG, min_count=40)
    box = [y for i, y in enumerate(rows) if all(b - a <= 4 for a, b in zip(rows[:i], rows[1:i + 1]))]
    assert box and box[0] < 400 and box[-1] - box[0] > 150, (box[:1], box[-1:], rows[:40])  # the answer first
    edge = [x for x in range(width) if _near(img.getpixel((x, box[len(box) // 2])), SUMMARY_EDGE, 30)]
    assert edge and edge[0] > 0 and edge[-1] < width - 1  # the box's borders are both on screen: it fits
    # every row: a flat curve is one anti-aliased stroke, whose fully covered row may be an odd one
    assert _rows_with(img, BEST_LINE, min_count=30, step=1, tol=20), "no best-so-far curve drawn"
    dom = _chromium(["--dump-dom", url]).stdout
    assert 'id="summary"' in dom and dom.count("<svg ") >= 2 and "<script" not in dom
    assert not EXTERNAL.search(dom)
