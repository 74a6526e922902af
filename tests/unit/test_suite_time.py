"""benchmarks/suite_time.py: the command it times at a commit and the figures it reads from JUnit reports."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import suite_time  # noqa: E402  (a script beside harness.py, not a package)

from tests.conftest import REPO  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.unit.test_a" name="test_two" time="0.5"><skipped message="no"/></testcase>
{more}</testsuite></testsuites>"""


def test_this_checkouts_make_test_is_timed_as_make_test_suite(tmp_path):
    cmd = suite_time.suite_command(REPO, tmp_path)
    assert cmd[:3] == ["make", "--no-print-directory", "test-suite"] and f"JUNIT_DIR={tmp_path}" in cmd


def test_a_makefile_without_test_suite_is_timed_as_one_pytest_run(tmp_path):
    (tmp_path / "Makefile").write_text("test: $(STAMP)\n\t$(PY) -m pytest tests\n")
    cmd = suite_time.suite_command(tmp_path, tmp_path / "junit")
    assert cmd[1:4] == ["-m", "pytest", "tests"] and cmd[-1] == f"--junitxml={tmp_path / 'junit' / 'all.xml'}"


def test_the_reports_of_both_pytest_runs_are_counted_together(tmp_path):
    unit, integration = tmp_path / "unit.xml", tmp_path / "integration.xml"
    unit.write_text(REPORT.format(more=""))
    integration.write_text(REPORT.format(more='<testcase classname="tests.integration.test_b" name="test_slow" '
                                               'time="9.0"><failure message="x"/></testcase>'))
    figures = suite_time.junit_figures([unit, integration])
    assert (figures["tests"], figures["passed"], figures["skipped"], figures["failed"]) == (5, 2, 2, 1)
    assert figures["seconds_in_tests"] == 13.0
    assert figures["slowest"][0] == {"test": "tests/integration/test_b.py::test_slow", "seconds": 9.0,
                                     "outcome": "failed"}


def test_a_missing_or_broken_report_is_named(tmp_path):
    broken = tmp_path / "unit.xml"
    broken.write_text("<testsuites><testcase")
    with pytest.raises(SystemExit, match=f"{broken}: no readable JUnit report"):
        suite_time.junit_figures([broken])
    with pytest.raises(SystemExit, match="no JUnit report written"):
        suite_time.junit_figures([])
