"""perf/preflight.py's reading of `up`'s stage lines (as `up --dry-run` printed them on the sandbox)."""
from perf import preflight as P

# stderr of `bootstrap up -i inventory-gpu.yaml --dry-run --skip-check memlock` on the 2-node sandbox
LINES = """\
    0.1s node1            connect        done 0.1s
    0.1s node2            connect        done 0.1s
    0.1s node1            lock           done 0.1s
    0.5s node2            facts          done 0.4s
    0.5s node1            facts          done 0.4s
    0.5s node1            preflight      done 0.0s
    0.5s node2            preflight      done 0.0s
    0.6s node1            ports-listen   done 0.1s
    0.6s node2            ports-listen   done 0.1s
    0.7s node1            ports-connect  done 0.0s
    0.7s node2            ports-connect  done 0.1s
    0.8s node2            ports-stop     done 0.0s
    0.8s node1            ports-stop     done 0.0s
"""


def test_the_preflight_span_runs_from_the_first_preflight_start_to_the_last_ports_stop():
    assert round(P.span(LINES, P.PREFLIGHT_STAGES), 2) == 0.3
    assert round(P.span(LINES, ("facts",)), 2) == 0.4


def test_no_stage_lines_is_not_a_measurement():
    assert P.span("error: preflight failed\n", P.PREFLIGHT_STAGES) is None
