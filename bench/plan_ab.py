"""A/B of one plan-binding switch on a kept CNN plan: the same spec loaded twice, the switch on and off, timed in
one process, interleaved round by round, medians, with ONNX Runtime beside them as the yardstick.

A switch is a module attribute that ``Plan`` reads when it binds its steps (``planforge.targets.cpu.plan``'s
``COMPILED_PASSES`` or ``WAKE_PARTS``): the plan loaded with it set to False is the "off" side. Both plans are
checked against torch first. The plans come from a ``bench/cnn.py --keep DIR`` run (``DIR/pf-MODEL-SIZE``).
With ``--against DIR2`` the two sides are instead two tunings' plans of the same model (``DIR``'s and ``DIR2``'s,
each loaded as it is), so that a change to the tuner is judged on what it chose, not on two runs minutes apart.

Run: ``.venv/bin/python bench/plan_ab.py --spec DIR --models mobilenet_v3_small --sizes 96
[--switch COMPILED_PASSES | --against DIR2] [--rounds 15] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cnn import model_and_input, onnx_runtime  # noqa: E402
from phase_order import interleaved  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="the folder a bench/cnn.py --keep run wrote")
    ap.add_argument("--models", default="mobilenet_v3_small")
    ap.add_argument("--sizes", default="96")
    ap.add_argument("--switch", default="COMPILED_PASSES", help="a bool attribute of planforge.targets.cpu.plan")
    ap.add_argument("--against", default="", help="another bench/cnn.py --keep folder: its plan is the B side")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from planforge.api import load
    from planforge.ir import from_torch
    from planforge.targets.cpu import plan as plan_mod

    if not isinstance(getattr(plan_mod, args.switch, None), bool):
        sys.exit(f"error: planforge.targets.cpu.plan has no switch {args.switch!r} (a bool attribute)")
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    a_label, b_label = (args.spec, args.against) if args.against else (f"{args.switch}=on", f"{args.switch}=off")
    out = {"switch": args.switch, "against": args.against, "threads": threads, "rounds": args.rounds}
    for name in args.models.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            m, x, want = model_and_input(name, size)
            xn = x.numpy()
            spec = Path(args.spec) / f"pf-{name}-{size}" / "spec.json"
            if not spec.is_file():
                sys.exit(f"error: no kept plan at {spec} (run bench/cnn.py --keep {args.spec} first)")
            g = from_torch(m, (x,))
            plans = {}
            if args.against:
                other = Path(args.against) / f"pf-{name}-{size}" / "spec.json"
                if not other.is_file():
                    sys.exit(f"error: no kept plan at {other} (run bench/cnn.py --keep {args.against} first)")
                plans[True], plans[False] = load(spec, graph=g), load(other, graph=g)
            else:
                for on in (True, False):
                    setattr(plan_mod, args.switch, on)
                    plans[on] = load(spec, graph=g)
                setattr(plan_mod, args.switch, True)
            errs = {on: float(np.abs(p(xn)[0] - want).max()) for on, p in plans.items()}
            fns = {a_label: lambda p=plans[True]: p(xn), b_label: lambda p=plans[False]: p(xn)}
            ort_run = onnx_runtime(m, x, Path(spec).parent / "ab.onnx", threads)
            if ort_run is not None:
                fns["ONNX Runtime"] = ort_run
            med = interleaved(fns, args.rounds, 0.05)
            print(f"\n{name} 1x3x{size}x{size}, {threads} threads, {args.rounds} rounds, max abs error "
                  f"on {errs[True]:.1e} off {errs[False]:.1e}")
            for k, v in med.items():
                print(f"  {k:40s} {v * 1e3:8.3f} ms")
            print(f"  {'A / B' if args.against else 'on / off'} = {med[a_label] / med[b_label]:.3f}")
            out[f"{name}-{size}"] = {"ms": {k: v * 1e3 for k, v in med.items()}, "max_err": errs}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
