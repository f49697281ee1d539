import dataclasses
import json
import math
import os
from pathlib import Path

import pytest

from planforge.backends import probe as pr
from planforge.backends.probe import DeviceProfile, ProfileError


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A planforge cache of its own for this module, so the user's cache is never touched."""
    root = tmp_path_factory.mktemp("pfcache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANFORGE_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def prof(cache):
    """One quick probe for the whole module (about a second)."""
    return pr.get_profile(quick=True)


@pytest.fixture
def fake_measure(monkeypatch, tmp_path, prof):
    """An empty cache dir and a ``measure`` that counts its calls instead of measuring."""
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    calls = []

    def measure(hw=None, quick=False, progress=None):
        calls.append(quick)
        return dataclasses.replace(prof, measured_at=f"call {len(calls)}", quick=quick)

    monkeypatch.setattr(pr, "measure", measure)
    return calls


def test_fields_present_and_positive(prof):
    assert len(prof.fingerprint) == 16 and int(prof.fingerprint, 16) >= 0
    assert prof.cpu_model and prof.arch and prof.compiler
    assert prof.vector_lanes_fp32 in (1, 4, 8, 16)
    assert 1 <= prof.physical_cores <= prof.logical_cores == len(os.sched_getaffinity(0))
    assert prof.threads == (prof.logical_cores if prof.openmp else 1)
    assert prof.memory_bytes > 0
    if Path("/sys/devices/system/cpu/cpu0/cache").exists():
        assert {"L1d", "L2"} <= prof.caches.keys()
        assert all(c.bytes > 0 and c.shared_by >= 1 and c.instances >= 1 for c in prof.caches.values())
        assert prof.caches["L1d"].bytes < prof.caches["L2"].bytes
    numbers = [prof.peak_flops_1t, prof.peak_flops_all, prof.call_overhead_s, *prof.peak_flops_1t_by_bits.values()]
    for table in (prof.bandwidth, prof.bandwidth_1t):
        assert set(table) == {"DRAM"} | {lvl for lvl, c in pr._CACHE_OF.items() if c in prof.caches}
        for per in table.values():
            assert set(per) == {"read", "copy"}
            numbers += per.values()
    assert all(math.isfinite(x) and x > 0 for x in numbers)
    # any CPU of this century does over a GFLOP/s in this kernel; less means a broken kernel or count
    assert prof.peak_flops_1t > 1e9
    assert str(prof.peak_bits) in prof.peak_flops_1t_by_bits
    assert prof.peak_flops_1t == max(prof.peak_flops_1t_by_bits.values())
    assert prof.call_overhead_s < 1e-3
    assert prof.quick and prof.probe_seconds > 0
    assert prof.measured_at.endswith("+00:00")


def test_bandwidth_ordered(prof):
    for all_threads in (True, False):
        read = {lvl: prof.bw(lvl, "read", all_threads) for lvl in pr.LEVELS}
        assert read["L1"] >= read["L2"] >= read["DRAM"], read
        assert read["L3"] is None or read["L3"] >= read["DRAM"], read


def test_peak_scales_with_threads(prof):
    assert prof.peak_flops_all >= prof.peak_flops_1t
    # more than linear scaling would mean FLOPs counted twice
    assert prof.peak_flops_all <= 1.5 * prof.threads * prof.peak_flops_1t


def test_json_round_trip(prof):
    back = DeviceProfile.from_json(prof.to_json())
    assert back == prof and isinstance(back.caches["L1d"], pr.CacheLevel)
    assert back.bw("DRAM", "copy") == prof.bandwidth["DRAM"]["copy"]
    with pytest.raises(ValueError, match="unknown bandwidth"):
        prof.bw("L9")


def test_fingerprint_is_hardware_only(prof):
    hw = pr.hardware()
    assert hw.fingerprint == pr.hardware().fingerprint == prof.fingerprint
    assert dataclasses.replace(hw, nominal_clock_hz=1.0, notes=("x",)).fingerprint == hw.fingerprint
    assert dataclasses.replace(hw, logical_cores=hw.logical_cores + 1).fingerprint != hw.fingerprint
    assert dataclasses.replace(hw, caches={}).fingerprint != hw.fingerprint
    assert os.uname().nodename not in json.dumps(prof.to_dict())


def test_cached_profile_reused_and_force_remeasures(prof, fake_measure):
    first = pr.get_profile(quick=True)
    assert fake_measure == [True]
    assert pr.get_profile(quick=True) == first and fake_measure == [True]
    # a quick profile does not stand in for a full one
    full = pr.get_profile()
    assert fake_measure == [True, False] and not full.quick
    assert pr.get_profile() == full and pr.get_profile(quick=True) == full and len(fake_measure) == 2
    again = pr.get_profile(force=True)
    assert len(fake_measure) == 3 and again.measured_at == "call 3"
    assert pr.load_profile(pr.profile_path(prof.fingerprint)).measured_at == "call 3"


def test_real_cache_hit_does_not_measure(prof, cache, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("measured although a profile was cached")

    monkeypatch.setattr(pr, "measure", boom)
    assert pr.get_profile(quick=True) == prof


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe\x00", b"[]", b'{"version": 1}',
    "version 999", "peak as text", "other machine",
])
def test_corrupt_cache_file_is_remeasured(prof, fake_measure, content):
    path = pr.profile_path(prof.fingerprint)
    path.parent.mkdir(parents=True)
    if isinstance(content, str):
        d = prof.to_dict()
        if content == "version 999":
            d["version"] = 999
        elif content == "peak as text":
            d["peak_flops_1t"] = "fast"
        else:
            d["fingerprint"] = "0" * 16
        content = json.dumps(d).encode()
    path.write_bytes(content)
    with pytest.warns(RuntimeWarning, match="unusable.*measuring again"):
        got = pr.get_profile(quick=True)
    assert fake_measure == [True] and got.measured_at == "call 1"
    assert pr.load_profile(path) == got


def test_from_json_errors_are_clear():
    with pytest.raises(ProfileError, match="not JSON"):
        DeviceProfile.from_json("{")
    with pytest.raises(ProfileError, match="profile version"):
        DeviceProfile.from_json('{"version": 0}')


def test_degraded_hardware_without_proc_or_sys(tmp_path):
    hw = pr.hardware(root=tmp_path)
    assert hw.caches == {} and hw.isa == ()
    assert any("cpuinfo" in n for n in hw.notes) and any("cache sizes unknown" in n for n in hw.notes)
    assert hw.logical_cores >= 1 and hw.physical_cores == hw.logical_cores
    assert len(hw.fingerprint) == 16
    # without cache sizes only DRAM is measured, over a buffer that no cache holds
    slices = pr._slices(hw, 2)
    assert set(slices) == {"DRAM"}
    assert slices["DRAM"] == (min(256 * 2**20, hw.memory_bytes // 8) // 2, min(256 * 2**20, hw.memory_bytes // 8))


def test_degraded_profile_measures_what_it_can(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path / "cache"))
    p = pr.measure(pr.hardware(root=tmp_path / "root"), quick=True)
    assert set(p.bandwidth) == set(p.bandwidth_1t) == {"DRAM"}
    assert p.peak_flops_1t > 0 and p.notes
    assert DeviceProfile.from_json(p.to_json()) == p


def test_arm_cpuinfo_and_sysfs_caches(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes asimdhp asimddp sve\n"
        "CPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n")
    (tmp_path / "proc" / "meminfo").write_text("MemTotal:       16384000 kB\nMemFree:  1 kB\n")
    base = tmp_path / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu}"
    for idx, (level, kind, size, shared) in enumerate([
            ("1", "Data", "64K", str(cpu)), ("1", "Instruction", "64K", str(cpu)),
            ("2", "Unified", "1024K", str(cpu)), ("3", "Unified", "32M", "0-63")]):
        d = base / "cache" / f"index{idx}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(value + "\n")
    (base / "topology").mkdir()
    (base / "topology" / "core_cpus_list").write_text(f"{cpu}\n")
    hw = pr.hardware(root=tmp_path)
    assert hw.cpu_model == "implementer 0x41 part 0xd40"
    assert set(hw.isa) == {"neon", "asimd", "asimdhp", "asimddp", "sve"} and hw.vector_lanes_fp32 == 4
    assert hw.caches["L1d"] == pr.CacheLevel(64 * 1024, 1, 1)
    assert hw.caches["L2"].bytes == 2**20 and hw.caches["L3"] == pr.CacheLevel(32 * 2**20, 64, 1)
    assert "L1i" not in hw.caches and hw.memory_bytes == 16384000 * 1024


def test_cli_probe_json_and_table(cli, cache, prof):
    env = {"PLANFORGE_CACHE": str(cache)}
    r = cli("probe", "--json", "--quick", env=env, check=True)
    assert json.loads(r.stdout) == json.loads(prof.to_json())
    r = cli("probe", "--quick", env=env, check=True)
    for part in ("AMD" if "AMD" in prof.cpu_model else prof.arch, "GFLOP/s", "DRAM", "L1", "call overhead",
                 f"{prof.peak_flops_1t / 1e9:.1f}"):
        assert part in r.stdout, part


def test_cli_missing_compiler_is_a_clear_error(cli, tmp_path, prof):
    # a corrupt cached profile forces a measurement, which needs the compiler
    path = tmp_path / "profiles" / f"{prof.fingerprint}.json"
    path.parent.mkdir()
    path.write_text("{truncated")
    r = cli("probe", "--quick", env={"PLANFORGE_CACHE": str(tmp_path), "CC": "no-such-cc-planforge"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "no C compiler" in r.stderr and "no-such-cc-planforge" in r.stderr
    assert "warning:" in r.stderr and "unusable" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_openmp_measures_on_one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    real_build = pr.build

    def build(source, openmp=False, **kw):
        if openmp:
            raise pr.BuildError("compile failed: unsupported option '-fopenmp'")
        return real_build(source, openmp=False, **kw)

    monkeypatch.setattr(pr, "build", build)
    p = pr.measure(quick=True)
    assert not p.openmp and p.threads == 1
    assert p.peak_flops_all == p.peak_flops_1t > 0 and p.bandwidth == p.bandwidth_1t
    assert any("OpenMP build failed" in n for n in p.notes)
