"""Learned cost model: a LightGBM ranker (lambdarank) on knob values plus analytic features.

Measurements are grouped into queries (one per task, since times of different
shapes or machines are never compared) and turned into graded relevance, as
lambdarank needs integer labels below the number of label gains (31 by
default): within a query the fastest measured point gets 30, the slowest 1,
by rank; a failed or pruned point gets 0. The gain of a grade is the grade
itself (linear), not LightGBM's default 2^grade - 1: a search needs the whole
order right, not only the first few places (on the recorded GPU spaces the
linear gain lifts Spearman from 0.65-0.85 to 0.80-0.94, see docs/benchmarks.md). The model is retrained as
measurements arrive (``fit`` after ``add``), and can be warm-started from the
records of earlier runs of the same template on the same device.

Rows measured at another shape (a warm start's source, an earlier run of the
same template at another size: a query group whose name carries a task key
such as ``gemm_256x1024x1024_bias_relu``) are described by their own shape:
the analytic features of the model at that shape (``Sized.at``), the
problem's sizes and each tile knob's tile count along each size
(``columns.shape_columns``). So the ranker learns how a configuration fares
relative to its shape, which is what transfers from one shape to another,
instead of reading another shape's times as if they were this one's.

``predict`` follows the ``CostModel`` convention (lower is better): it returns
the negated ranking score. LightGBM runs single-threaded and deterministic,
seeded from ``seed``, so a run is reproducible.
"""
from __future__ import annotations

import math
import random
import re
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
from scipy import stats

from ..space import Candidate, Space, SpaceError
from .columns import columns, shape_columns
from .funnel import Analytic
from .metrics import kendall, spearman, top_k_recall

MAX_GRADE = 30  # LightGBM's default label_gain has 31 entries: labels 0..30
MAX_QUERY = 10_000  # LightGBM's limit on the rows of one query


def task_dims(label: str) -> tuple[int, ...] | None:
    """The problem sizes a task key (or a group or source label that starts with one) carries:
    ``gemm_256x1024x2048_bias`` -> (256, 1024, 2048); None when it carries none."""
    m = re.search(r"_(\d+(?:x\d+)*)(?:_|$|[ @])", label)
    return tuple(int(x) for x in m.group(1).split("x")) if m else None


@runtime_checkable
class Sized(Protocol):
    """An analytic model of one problem size that can be had at another (``AnalyticModel``): its sizes,
    its useful FLOPs and the names of its features (``log_*`` ones other than ``log_intensity`` are
    log-seconds)."""

    dims: tuple[int, ...]
    useful: float

    def at(self, dims: Sequence[int]) -> Analytic: ...

    def feature_names(self) -> list[str]: ...


def grades(metrics: Sequence[float | None]) -> np.ndarray:
    """Integer relevance per point: 1..30 by rank among the measured (fastest
    highest, ties share a grade), 0 for a point without a time."""
    out = np.zeros(len(metrics), dtype=np.int64)
    ok = [i for i, m in enumerate(metrics) if m is not None and math.isfinite(m)]
    if not ok:
        return out
    if len(ok) == 1:
        out[ok[0]] = MAX_GRADE
        return out
    r = stats.rankdata([metrics[i] for i in ok], method="min")  # 1 = fastest; ties take the better rank
    frac = (r - 1) / (len(ok) - 1)
    out[ok] = 1 + np.floor((1 - frac) * (MAX_GRADE - 1) + 1e-9).astype(np.int64)
    return out


def knob_matrix(space: Space, candidates: Sequence[Candidate]) -> np.ndarray:
    """One column per knob: the value for numeric knobs, the value's index otherwise."""
    cols = columns(space, candidates)
    idx = np.array([c.index for c in candidates], dtype=float).reshape(len(candidates), len(space.knobs))
    out = []
    for i, k in enumerate(space.knobs):
        v = cols[k.name]
        out.append(v.astype(float) if v.dtype != object else idx[:, i])
    return np.column_stack(out) if out else np.zeros((len(candidates), 0))


class LearnedRanker:
    """LightGBM lambdarank over a space's knobs and an optional analytic model's features.

    Parameters:
        space: the space whose candidates it ranks.
        analytic: an ``Analytic`` model (``costmodel.funnel.Analytic``: its
            ``estimate`` and ``features_of`` give the features); None: knob
            values only.
        seed: seeds LightGBM (default 0).
        rounds: boosting rounds (default 100); leaves: leaves per tree
            (default 15); min_fit: measured points at this problem's shape
            needed before the first fit (default 8; rows of other shapes
            count beside them once there are that many).
    """

    name = "lightgbm-lambdarank"

    def __init__(self, space: Space, analytic: Analytic | None = None, seed: int = 0, rounds: int = 100, leaves: int = 15,
                 min_fit: int = 8, learning_rate: float = 0.1):
        import lightgbm  # noqa: F401  (fail here, clearly, when it is missing)

        self.space, self.analytic, self.seed = space, analytic, seed
        self.rounds, self.leaves, self.min_fit, self.learning_rate = rounds, leaves, min_fit, learning_rate
        self.groups: dict[str, list[tuple[np.ndarray, float | None]]] = {}
        # the problem's sizes when the analytic model can be had at other sizes: rows of other shapes are then
        # described by their own (see the module's docstring)
        self.dims = tuple(analytic.dims) if isinstance(analytic, Sized) else None
        self._at: dict[tuple[int, ...], Analytic] = {}
        # log-seconds features are taken per useful FLOP: a larger shape takes longer at every point, and
        # trees split on levels, so absolute times of one shape say nothing of another's (a constant shift
        # within one shape changes no split)
        self._times = [i for i, n in enumerate(analytic.feature_names())
                       if n.startswith("log_") and n != "log_intensity"] if self.dims is not None else []
        self.booster = None
        self.fits = 0
        self._dirty = False

    # -- data --------------------------------------------------------------------
    def shape_of(self, group: str) -> tuple[int, ...] | None:
        """The sizes rows of query ``group`` were measured at: those its name carries when they are another
        shape of this problem (as many sizes), else None (this problem's)."""
        d = task_dims(group) if self.dims is not None else None
        return d if d is not None and len(d) == len(self.dims) and d != self.dims and all(d) else None

    def encode(self, candidates: Sequence[Candidate], dims: Sequence[int] | None = None) -> np.ndarray:
        """Feature rows: knob columns, then the analytic features (when there is a model), then (when the
        model can be had at other sizes) the sizes and tile counts; all at the sizes ``dims`` (default:
        this problem's)."""
        x = knob_matrix(self.space, candidates)
        if self.analytic is not None and len(candidates):
            model = self.analytic
            if dims is not None and self.dims is not None and tuple(dims) != self.dims:
                dims = tuple(int(d) for d in dims)
                if dims not in self._at:
                    self._at[dims] = self.analytic.at(dims)
                model = self._at[dims]
            f = model.features_of(model.estimate(candidates))
            if self.dims is not None:
                f[:, self._times] -= math.log(max(model.useful, 1.0))
                f = np.column_stack([f, shape_columns(self.space, candidates, dims or self.dims)])
            x = np.column_stack([x, f])
        return np.nan_to_num(x, nan=0.0, posinf=1e30, neginf=-1e30)

    def add(self, candidates: Sequence[Candidate], metrics: Sequence[float | None], group: str = "current") -> None:
        """Add measured points (metric None: failed or pruned) to query ``group``; a group named after
        another shape of this problem (``shape_of``) is encoded at that shape."""
        if not candidates:
            return
        rows = self.encode(candidates, self.shape_of(group))
        self.groups.setdefault(group, []).extend(zip(rows, metrics))
        self._dirty = True

    def add_configs(self, rows: Iterable[tuple[str, Mapping[str, Any], float | None]]) -> int:
        """Add ``(group, config, metric)`` rows (from the records); configs that are not
        points of this space are skipped. Returns how many were added."""
        by: dict[str, tuple[list[Candidate], list[float | None]]] = {}
        for g, cfg, m in rows:
            try:
                c = self.space.make(cfg)
            except (SpaceError, KeyError, ValueError):
                continue
            cs, ms = by.setdefault(g, ([], []))
            cs.append(c)
            ms.append(m)
        for g, (cs, ms) in by.items():
            self.add(cs, ms, g)
        return sum(len(cs) for cs, _ in by.values())

    @property
    def measured(self) -> int:
        return sum(1 for rows in self.groups.values() for _, m in rows if m is not None)

    @property
    def measured_here(self) -> int:
        """Measured rows at this problem's shape (this task's, and earlier runs' of the same shape)."""
        return sum(1 for g, rows in self.groups.items() if self.shape_of(g) is None for _, m in rows if m is not None)

    # -- training and prediction -------------------------------------------------
    def fit(self) -> bool:
        """Retrain on everything added (no-op when nothing new); False while too little is known."""
        import lightgbm as lgb

        if not self._dirty:
            return self.booster is not None
        if self.measured_here < self.min_fit:
            # other shapes' rows wait for min_fit of this shape's: until then this shape's analytic model
            # orders its points better than a ranker that has seen no time of it (bench/warm_shapes.py: the
            # roofline's first batch was within 5% of the best on GEMM 128x1024x1024, a ranker fitted on
            # 256x1024x1024 alone never got there in 32 evaluations)
            return False
        xs, ys, sizes = [], [], []
        rng = random.Random(self.seed)
        for g in sorted(self.groups):
            rows = self.groups[g]
            order = list(range(len(rows)))
            if len(rows) > MAX_QUERY:
                rng.shuffle(order)
            for s in range(0, len(order), MAX_QUERY):
                part = [rows[i] for i in order[s:s + MAX_QUERY]]
                lab = grades([m for _, m in part])
                if len(part) < 2 or len(set(lab.tolist())) < 2:
                    continue
                xs.append(np.array([r for r, _ in part]))
                ys.append(lab)
                sizes.append(len(part))
        if not sizes:
            return False
        x, y = np.vstack(xs), np.concatenate(ys)
        params = {"objective": "lambdarank", "num_leaves": self.leaves, "learning_rate": self.learning_rate,
                  "min_data_in_leaf": 2, "min_sum_hessian_in_leaf": 1e-6, "min_data_in_bin": 1,
                  "lambdarank_truncation_level": max(sizes), "label_gain": list(range(MAX_GRADE + 1)),
                  "num_threads": 1, "deterministic": True,
                  "force_col_wise": True, "seed": self.seed, "verbose": -1}
        ds = lgb.Dataset(x, y, group=sizes, params={"verbose": -1, "min_data_in_bin": 1})
        self.booster = lgb.train(params, ds, num_boost_round=self.rounds)
        self.fits += 1
        self._dirty = False
        return True

    @property
    def ready(self) -> bool:
        return self.booster is not None

    def score_rows(self, x: np.ndarray) -> np.ndarray:
        """Ranking scores (higher is better) of encoded rows."""
        if self.booster is None:
            raise RuntimeError("the ranker has not been fitted yet")
        return self.booster.predict(x, num_threads=1)

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        """Negated ranking scores (lower is better, the ``CostModel`` convention)."""
        if not candidates:
            return []
        return [-float(s) for s in self.score_rows(self.encode(candidates))]


class HeldOut:
    """Predictions made before the measurement they predict, kept to judge a model honestly."""

    def __init__(self):
        self.pred: list[float] = []
        self.meas: list[float] = []

    def add(self, pred: Sequence[float], meas: Sequence[float | None]) -> None:
        for p, m in zip(pred, meas):
            if m is not None and math.isfinite(m) and math.isfinite(p):
                self.pred.append(p)
                self.meas.append(m)

    def report(self, k: int = 10) -> dict[str, Any]:
        k = min(k, max(1, len(self.meas) // 4))
        return {"pairs": len(self.meas), "spearman": spearman(self.pred, self.meas),
                "kendall": kendall(self.pred, self.meas),
                f"top{k}_recall": top_k_recall(self.pred, self.meas, k) if len(self.meas) >= 4 else None}


def history(records, target: str, task_key: str, names: Sequence[str], exclude_run: str | None = None
            ) -> list[tuple[str, dict[str, Any], float | None]]:
    """Earlier measurements of the same template on the same device, as ``(group, config, metric)``.

    Same template: the task key's first part (the op) and the knob names match.
    Each earlier task is its own query group, so times of different shapes are
    never compared with each other. Rejected (never measured) points are left out."""
    op = task_key.split("_", 1)[0]
    want = set(names)
    out = []
    for r in records.records(target=target):
        if r.run_id == exclude_run or r.task.split("_", 1)[0] != op or set(r.candidate) != want:
            continue
        if r.outcome.status == "rejected":
            continue
        out.append((f"{r.task}@{r.run_id}", r.candidate, r.outcome.metric))
    return out
