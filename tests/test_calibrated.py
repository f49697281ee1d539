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


def test_tiles_measured_in_one_format_rank_the_same_tiles_in_another():
    # the truth: bytes x an unpacking cost per format x a tile effect shared by the formats (tile 4 fastest);
    # the model knows the bytes only, so it ties every tile of a format
    unpack, effect = {"fp32": 1.0, "int8": 1.5, "int4": 4.0}, {1: 2.0, 2: 1.3, 4: 1.0}
    sp = space()
    truth = lambda c: Bytes.per[c["fmt"]] * 1e-3 * unpack[c["fmt"]] * effect[c["tile"]]  # noqa: E731
    tiles = lambda d: {"tile": d["tile"]}  # noqa: E731
    m, alone = PerStratum(Bytes(), lambda d: d["fmt"], tiles=tiles), PerStratum(Bytes(), lambda d: d["fmt"])
    seen = [sp.make({"fmt": "fp32", "tile": t}) for t in (1, 2, 4)] + [sp.make({"fmt": "int8", "tile": 1})]
    for c in seen:
        m.observe(c, truth(c))
        alone.observe(c, truth(c))
    int8 = [sp.make({"fmt": "int8", "tile": t}) for t in (1, 2, 4)]
    got = m.predict(int8)
    assert got[2] < got[1] < got[0]  # int8's tiles ranked as fp32's ran, though only int8 tile 1 was measured
    assert len(set(alone.predict(int8))) == 1  # the stratum alone cannot tell them apart
    f = m.tile_factors()
    assert f[("tile", "4")] < f[("tile", "2")] < f[("tile", "1")]
    # the format's own term still ranks the formats as they ran: int8 tile 4 against fp32 tile 4
    fp32_4 = m.predict([sp.make({"fmt": "fp32", "tile": 4})])[0]
    assert got[2] < fp32_4  # 1.5 / 4 of fp32's time, and the model puts it below
    # a failed run changes nothing
    before = m.predict(int8)
    m.observe(int8[2], None)
    assert m.predict(int8) == before
