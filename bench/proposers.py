"""The playbook proposer's first 8 proposals against random search's first 8, on the CPU kernel bench's shapes.

For each shape of ``bench/cpu_kernels.py`` (fp32, epilogue bias+ReLU): the
playbook is given the task's context with the template's careful first setting
(``Target.default_knobs``) as the incumbent and no measurement yet (rules only;
``--records DB`` lets it learn from a records database too); random search
draws from the same whole space with a seed. Both candidate lists are measured
by the task's backend in one process, interleaved (playbook i, random i, ...),
and the two bests are then re-measured interleaved (``Backend.remeasure``).
Printed per kernel: best of 8 and median of 8 of each, the ratios
playbook / random (below 1: the playbook is faster), and the re-measured ratio.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/proposers.py [--shapes 1x256x256,...]
        [--seeds 0] [--n 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from cpu_kernels import SHAPES  # noqa: E402

from planforge.l2 import build_context, triage  # noqa: E402
from planforge.l2.playbook import Playbook  # noqa: E402
from planforge.search.strategies import RandomSearch  # noqa: E402
from planforge.targets import get_target  # noqa: E402
from planforge.targets.cpu.probe import get_profile  # noqa: E402
from planforge.workloads import load_workload  # noqa: E402


def playbook_first(task, target, n: int, records=None):
    """The playbook's first ``n`` admitted, distinct proposals for ``task`` from the template's first setting."""
    base = task.space.nearest_valid(target.default_knobs(task.backend.problem)) or next(task.space.enumerate())
    ctx = build_context(task.key, task.space, task.backend, [], (base, float("nan")))
    ctx.incumbent_s = None
    pb = Playbook(records=records, target=task.backend.fingerprint if records else None)
    got = pb.propose(ctx, n)
    verdicts = triage(task.space, [got], base, frozenset())
    cands = [v.candidate for v in verdicts if v.fate == "queued"][:n]
    refused = [v.reason for v in verdicts if v.fate == "refused"]
    return base, cands, [v.proposal.source for v in verdicts if v.fate == "queued"][:n], refused


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="", help="subset, e.g. '1x256x256,64x512x512' (default: all 12)")
    ap.add_argument("--n", type=int, default=8, help="proposals of each (default 8)")
    ap.add_argument("--seeds", default="0", help="random search seeds, comma-separated (default 0)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the final interleaved re-measurement")
    ap.add_argument("--records", default="", help="a records database the playbook learns from (default: none)")
    ap.add_argument("--json", default="", help="write the rows here too")
    args = ap.parse_args()
    prof = get_profile()
    target = get_target("cpu")
    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    records = None
    if args.records:
        from planforge.spec import Records

        records = Records(args.records)
    print(f"device {prof.cpu_model}; isa {' '.join(prof.isa)}; {prof.vector_lanes_fp32} fp32 lanes; "
          f"{prof.physical_cores} cores; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    hdr = (f"{'M x N x K':>14} {'seed':>4} {'pb best':>9} {'rnd best':>9} {'best pb/rnd':>11} {'pb med':>9} "
           f"{'rnd med':>9} {'med pb/rnd':>10} {'re-measured':>11} {'pb ok':>5} {'rnd ok':>6}")
    print(hdr)
    rows = []
    for m, nn, k in shapes:
        wl = load_workload("gemm", {"shape": f"{m},{nn},{k}", "epilogue": "bias_relu"})
        task = wl.tasks[0]
        be = task.backend
        try:
            base, pb, sources, refused = playbook_first(task, target, args.n, records)
            for seed in seeds:
                rnd = RandomSearch(task.space, seed).ask(args.n)
                pb_o, rnd_o = {}, {}
                for i in range(max(len(pb), len(rnd))):  # interleaved: a slow phase hits both alike
                    if i < len(pb):
                        pb_o[i] = be.measure([pb[i]])[0]
                    if i < len(rnd):
                        rnd_o[i] = be.measure([rnd[i]])[0]
                pt = [o.metric for o in pb_o.values() if o.ok]
                rt = [o.metric for o in rnd_o.values() if o.ok]
                row = {"shape": [m, nn, k], "template": be.problem.op, "seed": seed, "n": args.n,
                       "playbook": {"measured": len(pb), "ok": len(pt), "best_s": min(pt) if pt else None,
                                    "median_s": statistics.median(pt) if pt else None, "sources": sources,
                                    "refused": refused, "failed": [o.message[:120] for o in pb_o.values() if not o.ok]},
                       "random": {"measured": len(rnd), "ok": len(rt), "best_s": min(rt) if rt else None,
                                  "median_s": statistics.median(rt) if rt else None,
                                  "failed": [o.message[:120] for o in rnd_o.values() if not o.ok]},
                       "base": base.as_dict()}
                if pt and rt:
                    bp = pb[min((i for i in pb_o if pb_o[i].ok), key=lambda i: pb_o[i].metric)]
                    br = rnd[min((i for i in rnd_o if rnd_o[i].ok), key=lambda i: rnd_o[i].metric)]
                    outs, _ = be.remeasure([bp, br], libraries=["numpy"], rounds=args.rounds)
                    row["remeasured"] = {"playbook_s": outs[0].metric, "random_s": outs[1].metric,
                                         "playbook_plan": bp.as_dict(), "random_plan": br.as_dict()}
                    row["best_ratio"] = min(pt) / min(rt)
                    row["median_ratio"] = statistics.median(pt) / statistics.median(rt)
                    row["remeasured_ratio"] = (outs[0].metric / outs[1].metric
                                               if outs[0].ok and outs[1].ok else None)
                rows.append(row)
                us = lambda s: f"{s * 1e6:8.1f}u" if s else "      n/a"  # noqa: E731
                r = lambda x: f"{x:.3f}" if x is not None else "n/a"  # noqa: E731
                print(f"{f'{m}x{nn}x{k}':>14} {seed:>4} {us(row['playbook']['best_s'])} {us(row['random']['best_s'])} "
                      f"{r(row.get('best_ratio')):>11} {us(row['playbook']['median_s'])} {us(row['random']['median_s'])} "
                      f"{r(row.get('median_ratio')):>10} {r(row.get('remeasured_ratio')):>11} "
                      f"{len(pt):>2}/{len(pb):<2} {len(rt):>3}/{len(rnd):<2}", flush=True)
        finally:
            be.close()
    done = [x for x in rows if x.get("best_ratio")]
    if done:
        gm = lambda xs: statistics.geometric_mean(xs)  # noqa: E731
        print(f"geometric mean over {len(done)} kernel-seed pairs: best {gm([x['best_ratio'] for x in done]):.3f}, "
              f"median {gm([x['median_ratio'] for x in done]):.3f}, re-measured "
              f"{gm([x['remeasured_ratio'] for x in done if x.get('remeasured_ratio')]):.3f} (playbook / random)")
        print(f"playbook best faster on {sum(x['best_ratio'] < 1 for x in done)} of {len(done)}; re-measured faster "
              f"on {sum((x.get('remeasured_ratio') or 9) < 1 for x in done)} of {len(done)}")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": prof.cpu_model, "isa": prof.isa, "rows": rows}, f, indent=1, default=str)
    if records is not None:
        records.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
