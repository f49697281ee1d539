"""The analytic model corrected per stratum (a kernel's weight format) by measured times."""
from __future__ import annotations

import numpy as np

from planforge.costmodel.calibrated import PerStratum
from planforge.costmodel.funnel import Analytic
from planforge.space import Space, categorical


class Bytes:
    """A roofline-like model: time from the bytes each format streams, the tile ignored."""
    name = "bytes"
    per = {"fp32": 4.0, "int8": 1.0, "int4": 0.5}

    def predict(self, cands):
        return [self.per[c["fmt"]] * 1e-3 for c in cands]

    def evaluate(self, cols):
        return cols

    def estimate(self, cands):
        return np.array(self.predict(cands))

    def lower_bound(self, cands):
        return [0.5 * p for p in self.predict(cands)]

    def features_of(self, e):
        return np.log(np.asarray(e))[:, None]

    dims = (1, 64, 64)


def space():
    return Space([categorical("fmt", ("fp32", "int8", "int4")), categorical("tile", (1, 2, 4))])


def test_each_format_ranked_as_it_ran():
    sp = space()
    m = PerStratum(Bytes(), lambda d: d["fmt"])
    assert isinstance(m, Analytic) and m.dims == (1, 64, 64)  # what the learned ranker reads passes through
    c = {f: sp.make({"fmt": f, "tile": 1}) for f in ("fp32", "int8", "int4")}
    before = m.predict(list(c.values()))
    assert before == Bytes().predict(list(c.values()))  # nothing measured: the model's own ranking (int4 first)
    m.observe(c["int8"], 1.2e-3)   # int8 ran at 1.2x what its bytes say
    m.observe(c["int4"], 2.0e-3)   # int4's unpacking: 4x what its bytes say, slower than int8
    m.observe(c["fp32"], None)     # a failed run says nothing of the model
    assert m.factors() == {"int8": 1.2, "int4": 4.0}
    got = dict(zip(c, m.predict(list(c.values()))))
    assert got["int8"] < got["int4"]  # now int8 leads, as measured
    # a format not measured yet takes the median over every measured point
    assert np.isclose(got["fp32"], 4e-3 * np.median([1.2, 4.0]))
    # bounds and features stay the model's own
    assert m.lower_bound([c["int4"]]) == Bytes().lower_bound([c["int4"]])
    other = sp.make({"fmt": "int4", "tile": 4})
    assert np.isclose(m.predict([other])[0], 0.5e-3 * 4.0)  # every point of a stratum gets its correction
