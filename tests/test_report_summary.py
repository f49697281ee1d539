"""The report's answer-first summary box, its warnings and its SVG plots, on synthetic run data (no tuning)."""
import copy
import re
import xml.etree.ElementTree as ET

import pytest

from planforge.report import plots
from planforge.report.html import render
from planforge.report.summary import fmt_bytes, fmt_si
from planforge.report.verdict import summarize

US = 1e-6


def _trial(n, lat, fp, label="fused_mlp", load=0.05, **kw):
    return {"n": n, "wall_s": n * 0.1, "fingerprint": fp, "plan": {"c_T2": f"fused_mlp#{n % 3}", "k_T2_0": n % 4},
            "label": label, "status": "measured", "category": None, "latency_s": lat, "spread": 0.03, "cached": False,
            "message": "", "proxy": lat * 1.3, "intensity": 2.0 + n, "repeats": 40, "other_load": load,
            "recheck": None, **kw}


def synthetic_run(busy_probe=True):
    """One task, 12 evaluations: the search's fastest (8.57 us, rank 1) is rejected by validation, rank 4 measured
    8.99 us in the search and 7.99 ms re-measured, evaluation 7 took 9.1 ms at 70% load and 9.4 us when measured
    again, and the device was probed at 43% load."""
    trials = [_trial(n, (30 - n) * US, f"fp{n}") for n in range(1, 13)]
    trials[4] = _trial(5, 8.99 * US, "drifty")
    trials[7] = _trial(8, 8.7 * US, "third")
    trials[8] = _trial(9, 8.57 * US, "best")
    trials[6] = _trial(7, 9.4 * US, "outlier", load=0.02, recheck={
        "first": {"median_s": 9.1e-3, "spread": 0.4, "repeats": 5, "other_load": 0.7},
        "second": {"median_s": 9.4 * US, "spread": 0.02, "repeats": 40, "other_load": 0.02}, "kept": "second"})
    trials[10] = {**_trial(11, 1.0, "bad"), "status": "invalid", "category": "timeout", "latency_s": None,
                  "message": "no result after 5 s", "proxy": None, "other_load": None}
    ranked = [
        {"rank": 1, "latency_s": 10.67 * US, "fingerprint": "best", "label": "fused_mlp", "plan": trials[8]["plan"],
         "spread": 0.04, "repeats": 120, "other_load": None, "search": {"latency_s": 8.57 * US, "repeats": 40}},
        {"rank": 2, "latency_s": 10.5 * US, "fingerprint": "third", "label": "fused_mlp", "plan": trials[7]["plan"],
         "spread": 0.15, "repeats": 120, "other_load": None, "search": {"latency_s": 8.7 * US, "repeats": 40}},
        {"rank": 3, "latency_s": 11.0 * US, "fingerprint": "outlier", "label": "fused_mlp", "plan": trials[6]["plan"],
         "spread": 0.05, "repeats": 120, "other_load": None, "search": {"latency_s": 9.4 * US, "repeats": 40}},
        {"rank": 4, "latency_s": 7.99e-3, "fingerprint": "drifty", "label": "fused_mlp", "plan": trials[4]["plan"],
         "spread": 0.05, "repeats": 120, "other_load": None, "search": {"latency_s": 8.99 * US, "repeats": 40}},
    ]
    task = {
        "weight": 1, "strategy": {"name": "genetic", "seed": 0}, "stop_reason": "budget of 12 evaluations spent",
        "evaluations": 12, "duplicates": 20, "search_seconds": 3.0, "counts": {"measured": 11, "timeout": 1},
        "curve": [], "space": {"size": 7 * 10**75, "knobs": 2}, "trials": trials, "ranked": ranked,
        "remeasured": True, "accepted_rank": 2, "rejected": [{"rank": 1, "reasons": ["fp16 accumulation over K=256"]}],
        "error": None, "baselines": {"numpy": {"latency_s": 47.25 * US, "spread": 0.02, "repeats": 120, "other_load": 0.35},
                                     "torch": {"latency_s": 60 * US, "spread": 0.03, "repeats": 120}},
        "best_library": ["numpy", 47.25 * US], "ratio_vs_library": 10.5 / 47.25, "fallback": None,
        "selected_latency_s": 10.5 * US, "saved_s": 1e-6,
        "proxy": {"name": "roofline", "spearman": 0.8, "unit": "s"},
        "importance": {"c_T2": 0.7, "k_T2_0": 0.3}, "knob_labels": {"c_T2": "T2: which implementation",
                                                                   "k_T2_0": "T2 fused_mlp#0: setting"},
        "funnel": [{"stage": "space", "count": 7 * 10**75}, {"stage": "measured", "count": 12}],
        "info": {}, "work": {"flops": 279584.0, "bytes": 560384.0},
        "accepted": {"rank": 2, "latency_s": 10.5 * US, "fingerprint": "third", "plan": trials[7]["plan"],
                     "label": "fused_mlp", "peak_bytes": 855296, "spread": 0.15, "repeats": 120,
                     "steps": [{"what": "fused_mlp", "cls": "T2", "knobs": {"threads": 2, "vec": 16}}]},
    }
    profile = {"peak_flops_all": 128.8e9, "threads": 2, "other_load": 0.43 if busy_probe else 0.02,
               "busy_figures": ["L3 read on 2 threads"] if busy_probe else [], "cpu_model": "test CPU",
               "measured_at": "2026-01-01", "quick": False,
               "caches": {"L1d": {"bytes": 49152, "instances": 2}, "L2": {"bytes": 2 << 20, "instances": 2}},
               "bandwidth": {"L1": {"read": 260e9}, "L2": {"read": 130e9}, "DRAM": {"read": 19e9}}}
    return {"run_version": 1, "planforge_version": "0", "created": "2026-01-01T00:00:00Z", "command": "test",
            "workload": "synthetic", "description": "a synthetic run", "manifest": {}, "run_id": "r1",
            "resumed": False, "ok": True, "notes": [], "search_seconds": 3.0, "saved_s_per_run": 1e-6,
            "break_even_runs": 3e6, "spec": "spec.json", "records": "records.db", "end_to_end": None,
            "environment": {"toolchain": {}, "platform": "test",
                            "targets": {"t": {"backend": "cpu", "fingerprint": "abc", "profile": profile}}},
            "tasks": {"t": task}}


def test_summary_box_answers_first_and_warns_about_a_busy_machine():
    box = summarize(synthetic_run())
    s = box["tasks"]["t"]
    assert s["plan"] == "fused_mlp (threads 2, vec 16)"
    assert s["latency"] == "10.5 us (re-measured median of 120 repeats, spread 15%)"
    assert s["speed"] == "4.5x faster than numpy" and s["libraries"] == "numpy 47.2 us, torch 60 us"
    cv = s["convergence"]
    assert cv["last_improvement"] == 9 and not cv["converged"] and "20 of 32 proposals were duplicates" in cv["text"]
    assert "the last doubling (evaluations 6 to 12) gained 5%" in cv["more"]
    w = "\n".join(s["warnings"])
    assert "probed while other processes used 43%" in w and "L3 read on 2 threads" in w  # busy probe
    assert "spread 15%" in w  # the chosen plan's spread is above 10%
    assert "re-measured while other processes used up to 35%" in w
    assert "Rank 4 (fused_mlp) measured 8.99 us during the search and 7.99 ms re-measured (889x slower)" in w
    assert "Rank 1" not in w  # 8.57 -> 10.67 us is within 2x
    assert "1 results at least 10x slower" in w and "9.1 ms, then 9.4 us" in w  # the outlier, measured twice
    notes = "\n".join(s["notes"])
    assert "fastest plan measured (8.57 us, fused_mlp) was rejected by validation: fp16 accumulation" in notes
    assert box["break_even"].startswith("the search took 3 s and saves 36.8 us per run over the fastest library")
    assert "81.6 k runs" in box["break_even"]


def test_a_short_search_is_not_called_converged():
    t = synthetic_run()["tasks"]["t"]
    t["trials"], t["evaluations"] = t["trials"][:5], 5
    cv = summarize({**synthetic_run(), "tasks": {"t": t}})["tasks"]["t"]["convergence"]
    assert not cv["converged"] and cv["more"].startswith("5 evaluations are too few to tell")


def test_a_quiet_run_has_no_load_warnings():
    run = synthetic_run(busy_probe=False)
    t = run["tasks"]["t"]
    t["accepted"]["spread"] = 0.02
    for x in t["trials"]:
        x["recheck"] = None
    t["ranked"] = t["ranked"][:3]
    t["baselines"]["numpy"]["other_load"] = 0.05
    assert summarize(run)["tasks"]["t"]["warnings"] == []
    for x in t["trials"][:6]:
        x["other_load"] = 0.6
    (w,) = summarize(run)["tasks"]["t"]["warnings"]
    assert w.startswith("6 of 11 measurements ran while other processes used more than 25%")


def _svg(text):
    """Parse an inline SVG (it must be well-formed XML); its title, desc and every mark's hover title."""
    root = ET.fromstring(text)
    return root, [t.text for t in root.iter("title")]


def test_plots_are_inline_svg_with_hover_titles_and_say_what_they_show():
    run = synthetic_run()
    t, prof = run["tasks"]["t"], run["environment"]["targets"]["t"]["profile"]
    root, titles = _svg(plots.curve(t))
    assert root.tag == "svg" and root.get("role") == "img" and titles[0] == "Best so far"
    desc = root.find("desc").text
    assert "11 measured plans over 12 evaluations" in desc and "re-measured at 10.5 us" in desc
    assert any(x.startswith("rank 4 fused_mlp: re-measured 7.99 ms") and "search 8.99 us" in x for x in titles)
    assert any("rejected: fp16 accumulation" in x for x in titles)  # the rejected finalist, marked apart
    assert any("measured twice; the other measurement 9.1 ms" in x for x in titles)
    assert any(x.startswith("#11 fused_mlp: timeout") for x in titles)
    ticks = [e.text for e in root.iter("text")]
    assert "10 us" in ticks and not any(re.fullmatch(r"1e-0\d", x or "") for x in ticks)  # us/ns, not seconds
    root, titles = _svg(plots.roofline(t, prof))
    desc = root.find("desc").text
    assert "probed on a busy machine" in desc and "% of the" in desc and "L2 roof" in desc
    pts = [x for x in titles if x.startswith("#")]
    assert len({re.search(r"at (\S+) FLOP/B", x).group(1) for x in pts}) > 5  # each plan at its own intensity
    assert all("of attainable" in x for x in pts)
    root, titles = _svg(plots.proxy(t, 4))
    desc = root.find("desc").text
    assert "n = 11" in desc and "Spearman 1.00" in desc and "top-4 hit rate" in desc  # proxy = 1.3x latency, timeouts out
    assert any(x.startswith("y = x") for x in titles)
    _, titles = _svg(plots.importance(t))
    assert titles[0] == "Knob importance" and "T2: which implementation (c_T2): 70% of the gain" in titles
    _, titles = _svg(plots.parallel(t))
    assert any(x.startswith("#1 fastest: fused_mlp, 8.57 us (evaluation 9)") for x in titles)
    assert plots.funnel(t) is None  # no model stages: one line of text instead
    assert "No model stages" in plots.why_not("funnel", t, prof) and "7 x 10^75" in plots.why_not("funnel", t, prof)


def test_proxy_stats_use_scipy_and_the_hit_rate():
    t = synthetic_run()["tasks"]["t"]
    st = plots.proxy_stats(t, 4)
    assert st["n"] == 11 and st["spearman"] == pytest.approx(1.0) and st["hit_rate"] == 1.0
    for x in t["trials"]:
        if x["proxy"]:
            x["proxy"] = 1 / x["proxy"]  # a proxy that ranks backwards
    st = plots.proxy_stats(t, 4)
    assert st["spearman"] == pytest.approx(-1.0) and st["hit_rate"] == 0.0


def test_several_tasks_get_end_to_end_figures_and_a_breakdown_in_amdahl_order():
    run = synthetic_run()
    run["tasks"]["u"] = copy.deepcopy(run["tasks"]["t"])
    run["end_to_end"] = {"median_s": 30 * US, "p99_s": 41 * US, "samples": 500, "library": "numpy",
                         "library_median_s": 90 * US, "library_p99_s": 99 * US,
                         "shares": [{"task": "t", "weight": 1, "latency_s": 10 * US, "share": 0.25},
                                    {"task": "u", "weight": 3, "latency_s": 10 * US, "share": 0.75}]}
    box = summarize(run)
    assert box["end_to_end"]["speed"] == "3.0x faster than numpy" and "p99 41 us over 500 calls" in box["end_to_end"]["latency"]
    assert "saves 60 us per run" in box["break_even"]
    root, titles = _svg(plots.breakdown(run["end_to_end"]))
    assert root.find("desc").text.startswith("u takes 75% of the time, then t 25%")
    html = render(run)
    assert 'id="plot-breakdown"' in html and "End to end" in html


def test_report_html_opens_with_the_summary_and_has_no_scripts():
    html = render(synthetic_run())
    assert html.index('id="summary"') < html.index('id="chosen"') < html.index("<svg ")
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "warning: The device was probed while other processes used 43%" in html
    assert "835 KiB" in html and "855,296" not in html  # sizes in KiB/MiB
    assert "7 x 10^75" in html and "7e+75" not in html  # counts as a reader says them
    assert html.count('class="why"') >= 8  # a one-line explanation per section
    for m in re.finditer(r"<svg .*?</svg>", html, re.S):
        _svg(m.group(0))  # every plot is well-formed
    # every colour the stylesheet and the plots write text in reads at 4.5:1 or better on white
    for color in set(re.findall(r"(?:color: |fill=\")(#[0-9a-f]{3,6})", html)) - {"#fff"}:
        assert _contrast(color) >= 4.5, color


def _contrast(hex_color):
    h = hex_color.lstrip("#")
    h = "".join(c * 2 for c in h) if len(h) == 3 else h
    def lum(c):
        c = int(c, 16) / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lum(h[i:i + 2]) for i in (0, 2, 4))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


def test_sizes_and_counts_read_as_a_person_writes_them():
    assert fmt_bytes(855_296) == "835 KiB" and fmt_bytes(3 << 20) == "3 MiB" and fmt_bytes(100) == "100 B"
    assert fmt_si(8_080_000) == "8.08 M" and fmt_si(532) == "532" and fmt_si(7 * 10**75) == "7 x 10^75"


def test_a_run_file_from_before_these_fields_still_renders(tmp_path):
    import json

    from planforge.report.html import write_report

    run = synthetic_run()
    del run["end_to_end"]
    t = run["tasks"]["t"]
    for k in ("importance", "knob_labels"):
        del t[k]
    for x in t["trials"]:
        for k in ("repeats", "other_load", "recheck"):
            del x[k]
    for r in t["ranked"]:
        for k in ("spread", "repeats", "other_load", "search"):
            r.pop(k)
    for k in ("steps", "spread", "repeats"):
        del t["accepted"][k]
    (tmp_path / "run.json").write_text(json.dumps(run))
    html = write_report(tmp_path).read_text()
    assert 'id="summary"' in html and "4.5x faster than numpy" in html and "None" not in html


def test_tune_prints_the_reports_trust_warnings_literally(tmp_path):
    import io
    import json
    from types import SimpleNamespace

    from rich.console import Console

    from planforge import cli

    (tmp_path / "run.json").write_text(json.dumps(synthetic_run()))
    out = io.StringIO()
    cli._print_trust_warnings(SimpleNamespace(report_path=tmp_path / "report.html"), Console(file=out, width=400))
    text = out.getvalue()
    assert "warning (t): " in text and "probed while other processes used 43%" in text
    assert "889x slower" in text
    quiet = io.StringIO()
    cli._print_trust_warnings(SimpleNamespace(report_path=None), Console(file=quiet))  # no report: nothing
    assert quiet.getvalue() == ""
