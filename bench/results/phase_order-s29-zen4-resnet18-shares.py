import json, sys, statistics
from pathlib import Path
sys.path.insert(0, "bench")
import phase_order as po
from planforge.api import load
g = po.MODELS["resnet18"]()
x = g.example_inputs(0)[0]
plan, steps, same, secs, spec = po.tuned(g, 24, Path("/tmp/s29/r18-e-graph-fix"), None)
print("e-graph (shares) tuned", f"{secs:.0f}s", flush=True)
s = json.load(open(spec))
for k, v in s["tasks"].items():
    print(" ", k, "%.1f us" % (v["latency_s"] * 1e6), "kern_s %.0f" % v["graph"].get("kernels_s", 0))
plans = {"e-graph shares": plan,
         "e-graph before": load("/tmp/s29/r18-e-graph/spec.json", graph=g),
         "epilogue first": load("/tmp/s29/r18-epilogue-first/spec.json", graph=g)}
samples = po.interleaved_samples({k: (lambda p: (lambda: p(x)))(p) for k, p in plans.items()}, 15)
med = {k: statistics.median(v) for k, v in samples.items()}
for k, v in med.items():
    print(f"  {k:16s} {v*1e6:8.1f} us  {v/med['epilogue first']:.3f}x epilogue first")
print(po.verdict(samples["e-graph shares"], samples["epilogue first"], 1.0))
