"""`make bench-contended`'s verdicts (issue 46): the CPU per read's ratio to B2r against the
unloaded run's, and the half-load p50 against B2r's in the contended run."""

from __future__ import annotations

from bench.contended import figures, verdicts

UNLOADED = {
    "e2e_cpu_us": 868.0,
    "B2r_cpu_us": 157.8,
    "lat_p50": 114.0,
    "B2r_lathalf_p50": 50.0,
    "e2e_reads": 1271.0,
    "B2r": 4774.0,
}


def test_contention_that_costs_the_pipeline_more_than_the_chain_is_not_met() -> None:
    # Unloaded 5.5x; contended the pipeline's CPU per read grows 50 %, B2r's 10 %: 7.5x.
    contended = UNLOADED | {"e2e_cpu_us": 1302.0, "B2r_cpu_us": 173.6, "lat_p50": 120.0}
    rows = verdicts(figures(contended), figures(UNLOADED))
    (cpu, half) = rows
    assert cpu[3] is False and "1.36x" in cpu[2]
    assert half[3] is True and "2.4x" in half[2]


def test_contention_that_costs_both_alike_is_met_and_a_slow_half_load_is_not() -> None:
    contended = UNLOADED | {"e2e_cpu_us": 1041.6, "B2r_cpu_us": 189.4, "lat_p50": 160.0}
    (cpu, half) = verdicts(figures(contended), figures(UNLOADED))
    assert cpu[3] is True
    assert half[3] is False  # 160 / 50 = 3.2x


def test_a_figure_not_measured_has_no_verdict() -> None:
    (cpu, half) = verdicts(figures({}), figures(UNLOADED))
    assert cpu[3] is None and half[3] is None
