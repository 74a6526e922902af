"""Run mlperf-logging's official compliance checker on a run's MLPerf log.

`python -m common.campaign.compliance RUN_DIR` checks RUN_DIR/mlperf.log with
`python -m mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0`, keeps the
checker's own log in RUN_DIR/compliance_checker.log, writes RUN_DIR/compliance.json and
exits 0 on the checker's SUCCESS and 5 when it fails (common/base/exits.py). A failed log is checked once more
without the quality target's rule (common/campaign/without_target.py): `only_target_failed` then says, by the
checker's own verdict rather than by reading its messages, that the target is all the log missed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

from common.base import exits
from common.base.cli import guarded
from common.base.files import write_json_atomic
from common.base.errors import BenchError

SEPARATOR = re.compile(r"^-{30}$", re.M)


@dataclasses.dataclass(frozen=True)
class ComplianceResult:
    log_file: str
    ruleset: str
    passed: bool
    messages: tuple[str, ...]  # the checker's findings, one per problem
    output: str
    passed_without_target: bool  # the checker's verdict with the quality target's rule removed
    target_checks: tuple[tuple[str, str], ...] = ()  # the removed rule(s): (key, condition)

    @property
    def only_target_failed(self) -> bool:
        """The log fails the checker, and passes it without the quality target's rule: the target is all it missed."""
        return not self.passed and self.passed_without_target


def check_log(log_file: str | Path, usage: str = "hpc", ruleset: str = "3.0.0") -> ComplianceResult:
    """Run the official checker on `log_file` (its log goes beside the MLPerf log)."""
    log_file = Path(log_file).resolve()
    if not log_file.is_file():
        raise BenchError(f"MLPerf log {log_file} does not exist; did the training run start?")
    checker_log = log_file.parent / "compliance_checker.log"
    cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", usage, "--ruleset", ruleset,
           "--log_output", str(checker_log), str(log_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=log_file.parent)
    output = proc.stdout + proc.stderr
    passed = proc.returncode == 0 and "SUCCESS" in output
    without, removed = (True, ()) if passed else _without_target(log_file, usage, ruleset)
    return ComplianceResult(str(log_file), f"{usage} {ruleset}", passed, _messages(output), output, without, removed)


def _without_target(log_file: Path, usage: str, ruleset: str) -> tuple[bool, tuple[tuple[str, str], ...]]:
    """The checker's verdict on `log_file` without the target's rule, and the rule(s) removed."""
    cmd = [sys.executable, "-m", "common.campaign.without_target", str(log_file), "--usage", usage,
           "--ruleset", ruleset]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        found = json.loads(proc.stdout)
        return bool(found["passed"]), tuple(tuple(r) for r in found["removed"])
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"the checker without the target's rule failed on {log_file} (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-500:]}") from None


def _messages(output: str) -> tuple[str, ...]:
    """Split the checker's WARNING block into one message per finding."""
    body = "\n".join(line.removeprefix("WARNING - ").strip() for line in output.splitlines()
                     if not line.startswith(("INFO - ", "** Logging", "ERROR - FAILED")))
    return tuple(m.strip() for m in SEPARATOR.split(body) if m.strip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run's output directory (holds mlperf.log)")
    parser.add_argument("--log-name", default="mlperf.log")
    parser.add_argument("--ruleset", default="3.0.0")
    args = parser.parse_args(argv)

    def run() -> int:
        result = check_log(Path(args.run_dir) / args.log_name, ruleset=args.ruleset)
        write_json_atomic(dataclasses.asdict(result), Path(args.run_dir) / "compliance.json")
        print(f"compliance checker (hpc {args.ruleset}) on {result.log_file}: "
              f"{'SUCCESS' if result.passed else 'FAILED'}")
        for message in result.messages:
            print(f"  - {message}")
        if result.only_target_failed:
            print("  every other check passes: the log misses only the quality target")
        return exits.SUCCESS if result.passed else exits.CHECKER_FAILED

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
