"""perf/shm_wake.py's report (the reproduction itself needs vLLM: it runs in the sandbox image)."""
from perf.shm_wake import summary


def test_the_report_counts_late_reads_and_those_the_poll_timeout_ended():
    lat = [0.0005] * 95 + [0.12, 0.19, 1.5, 4.98, 10.02]
    line = summary(0.0, lat, 5.0)
    assert line.startswith("busy_loop_s 0     reads 100:"), line
    assert "p50     0.50 ms" in line and "max  10020.0 ms" in line, line
    # late: the five above 50 ms; slow: the three above 1 s; of those, 4.98 and 10.02 are within 0.5 s
    # of a multiple of 5 s and 1.5 is not
    assert "> 50 ms:   5  > 1 s:   3" in line and "(+-0.5 s): 2" in line, line


def test_a_run_with_no_late_read_says_so():
    line = summary(0.1, [0.0002, 0.0003, 0.0009], 5.0)
    assert "> 50 ms:   0  > 1 s:   0" in line and line.endswith(": 0"), line
