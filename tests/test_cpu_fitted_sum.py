"""``conf/hardware/cpu_fitted_sum.yaml``: the shipped calibration (``docs/data/twin_cpu/calibration``) refitted with
every term the step model has today -- the deciding ``sum`` objective, the decode-start term, the busy timeline
(between-step and after-idle terms) and the API front end net of the in-flight residual -- is the documented
command's output (``docs/fidelity_cpu.md``, "The shipped profiles refitted"), and its new terms are the log's own
figures, read here from the log without the fit: the between-step term is the median logged gap <= 1 ms."""

from __future__ import annotations

import numpy as np
import pytest

from harness.run.config import PROJECT_ROOT
from harness.tools import steps as st
from harness.tools.inputs import HW_FIELDS, load_profile

RUN = PROJECT_ROOT / "docs" / "data" / "twin_cpu" / "calibration"


def test_cpu_fitted_sum_reproduces_from_its_shipped_calibration(tmp_path):
    from harness.tools import calibrate
    out = tmp_path / "cpu_fitted_sum.yaml"
    assert calibrate.main([str(RUN), "--from-steps", "--no-check", "--out", str(out)]) == 0
    fresh, shipped = load_profile(str(out)), load_profile("cpu_fitted_sum")
    for f in HW_FIELDS:
        a, b = getattr(fresh, f), getattr(shipped, f)
        assert (a == pytest.approx(b, rel=1e-12)) if isinstance(a, float) else a == b, f


def test_its_busy_timeline_and_decode_start_terms_are_priced():
    hw = load_profile("cpu_fitted_sum")
    steps, _ = st.load_step_times(RUN, skip_steps=8)
    gap = steps.idle_s.to_numpy(float)
    assert hw.between_step_s == pytest.approx(np.median(gap[(gap >= 0) & (gap <= 1e-3)]), rel=1e-9)
    assert hw.decode_start_s > 0 and hw.api_frontend_s > 0
    # the older twin profiles lack all three (fitted before the terms existed): kept as the twin's recorded prices
    for name in ("cpu_fitted", "cpu_fitted_absolute"):
        old = load_profile(name)
        assert old.decode_start_s == 0 and old.between_step_s == 0 and old.api_frontend_s == 0
