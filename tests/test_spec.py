import json

import pytest

from planforge.search import Budget
from planforge.spec import SCHEMA_VERSION, SpecError, dumps, load_spec, schema, validate
from planforge.tuning import tune
from planforge.workloads import load_workload


@pytest.fixture
def spec_file(tmp_path):
    r = tune(load_workload("drill"), strategy="genetic", budget=Budget(evals=24), seed=0, out=tmp_path / "a")
    return r.spec_path


def test_same_seed_gives_byte_identical_specs(tmp_path, spec_file):
    r = tune(load_workload("drill"), strategy="genetic", budget=Budget(evals=24), seed=0, out=tmp_path / "b")
    assert spec_file.read_bytes() == r.spec_path.read_bytes()
    r3 = tune(load_workload("drill"), strategy="genetic", budget=Budget(evals=24), seed=5, out=tmp_path / "c")
    assert json.loads(r3.spec_path.read_text())["tasks"]["mlp_layer"]["search"]["seed"] == 5


def test_spec_contents(spec_file):
    spec = load_spec(spec_file)
    assert spec["schema_version"] == SCHEMA_VERSION
    assert spec["manifest"]["workload"] == "drill" and spec["manifest"]["shapes"]["X"] == [64, 256]
    assert spec["target"]["fingerprint"].startswith("table:drill:")
    assert {"planforge", "python", "numpy"} <= set(spec["toolchain"])
    t = spec["tasks"]["mlp_layer"]
    assert t["plan"] == {"matmul": "cublaslt", "epilogue": "fused", "w_layout": t["plan"]["w_layout"],
                         "accumulate": "fp32"}
    assert t["latency_s"] == pytest.approx(103e-9)
    assert t["search"]["strategy"]["name"] == "genetic" and t["search"]["curve"][-1][1] == pytest.approx(95e-9)
    text = spec_file.read_text()
    assert text == dumps(spec)  # sorted keys, fixed indent


def test_published_schema_is_in_the_repo_and_valid():
    import jsonschema
    jsonschema.Draft202012Validator.check_schema(schema())


def test_malformed_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"schema_version": 1,\n  "tasks": [}')
    with pytest.raises(SpecError, match=r"not valid JSON \(line 2"):
        load_spec(p)


def test_future_version(tmp_path, spec_file):
    spec = json.loads(spec_file.read_text())
    spec["schema_version"] = SCHEMA_VERSION + 1
    p = tmp_path / "future.json"
    p.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match="newer planforge.*upgrade"):
        load_spec(p)


@pytest.mark.parametrize("mutate, fragment", [
    (lambda s: s.pop("manifest"), "'manifest' is a required property"),
    (lambda s: s["tasks"]["mlp_layer"].update(latency_s="fast"), "tasks/mlp_layer/latency_s"),
    (lambda s: s.update(schema_version="1"), "non-integer 'schema_version'"),
    (lambda s: s.update(tasks={}), "should be non-empty"),
])
def test_invalid_specs_say_where(spec_file, mutate, fragment):
    spec = json.loads(spec_file.read_text())
    mutate(spec)
    with pytest.raises(SpecError) as e:
        validate(spec, "x.json")
    assert fragment in str(e.value)


def test_missing_and_non_object(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.json")
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(SpecError, match="expected a JSON object"):
        load_spec(p)
