from slow_import_job import answer, hang, segfault

from planforge.measure.worker import Worker


def test_a_fresh_workers_start_up_is_not_charged_to_the_job():
    # the job's module takes 1.5 s to import in every fresh worker; the job itself 1 s at most
    with Worker() as w:
        r = w.run(answer, (), timeout=1.0)
        assert (r.status, r.value) == ("ok", 42) and r.wall_s < 1.0
        assert w.run(hang, (), timeout=0.5).status == "timeout"  # the job's own time still counts
        r = w.run(answer, (), timeout=1.0)  # a fresh worker again, after the kill
        assert (r.status, r.value) == ("ok", 42) and r.wall_s < 1.0
        r = w.run(segfault, (), timeout=1.0)
        assert r.status == "crashed" and "SIGSEGV" in r.message
        assert w.run(answer, (), timeout=1.0).value == 42


def test_adaptive_timeout_grows_with_the_machines_oversubscription():
    from planforge.measure import AdaptiveTimeout
    from planforge.measure.worker import oversubscription

    t = AdaptiveTimeout(factor=10.0, lo=1.0, hi=60.0, load=lambda: 1.0)
    assert t() == 60.0  # nothing finished yet: the ceiling
    t.observe(0.5)
    t.observe(0.8)
    assert t() == 5.0  # 10 x the fastest job
    t.load = lambda: 3.0  # three runnable threads per CPU: other jobs slow this one, it is no hang
    assert t() == 15.0
    t.load = lambda: 50.0
    assert t() == 60.0  # never past the ceiling
    t.load = lambda: 0.2  # an idle machine never shortens it
    assert t() == 5.0
    assert oversubscription() >= 1.0
