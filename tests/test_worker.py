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
