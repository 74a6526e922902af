"""The official compliance checker with one rule taken out: the quality target.

    python -m common.campaign.without_target LOG [--usage hpc] [--ruleset 3.0.0]

runs mlperf-logging's `ComplianceChecker` on LOG with the ruleset's own YAML files, except that every
`ATLEAST_ONE_CHECK` (the rules' quality target: CosmoFlow `eval_error <= 0.124`, DeepCAM `eval_accuracy >= 0.82`,
the only checks of that kind in hpc 3.0.0) is removed as each file is read. Every other check, the
`AT_LEAST_ONE` requirement of an evaluation included, stays. It prints one JSON object: `passed` (the checker's
verdict without the target) and `removed` (each removed check: its key and its condition). A log the full
checker fails and this one passes has failed the target's check and nothing else (common/campaign/compliance.py,
`ComplianceResult.only_target_failed`). A short test run, which cannot reach the target, is asserted that way.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

import yaml


def verdict(log: str, usage: str = "hpc", ruleset: str = "3.0.0") -> dict:
    """{"passed": bool, "removed": [[key, condition], ...]} of the checker without the target's checks."""
    from mlperf_logging.compliance_checker import mlp_compliance
    removed: list[list[str]] = []

    class WithoutTarget(mlp_compliance.ComplianceChecker):
        def configured_checks(self, loglines, config_file):
            with open(config_file) as f:
                checks = yaml.load(f, Loader=yaml.BaseLoader)
            for check in checks or []:
                record = check.get("KEY") if isinstance(check, dict) else None
                if isinstance(record, dict) and "ATLEAST_ONE_CHECK" in record:
                    removed.append([record["NAME"], record.pop("ATLEAST_ONE_CHECK").strip()])
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tmp:
                yaml.safe_dump(checks, tmp)
            try:
                super().configured_checks(loglines, tmp.name)
            finally:
                os.unlink(tmp.name)

    checker = WithoutTarget(usage, ruleset, quiet=True, werror=False)
    passed = checker.check_file(log, f"{usage}_{ruleset}/common.yaml")
    return {"passed": bool(passed), "removed": removed}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--usage", default="hpc")
    parser.add_argument("--ruleset", default="3.0.0")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the findings are the full checker's to report
    print(json.dumps(verdict(args.log, args.usage, args.ruleset)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
