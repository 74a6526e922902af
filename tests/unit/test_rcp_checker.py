"""The campaign's RCP verdict comes from mlperf-logging's own RCP checker (real, on written result files)."""
import json

from common.campaign.scoring import _rcp_line, rcp_check


def _result(path, batch: int, epochs: int) -> None:
    events = [("submission_benchmark", "cosmoflow", {}), ("global_batch_size", batch, {}),
              *[("eval_error", 0.2 if e < epochs else 0.12, {"epoch_num": e}) for e in range(1, epochs + 1)],
              ("run_stop", None, {"status": "success"})]
    path.write_text("".join(f":::MLLOG {json.dumps({'key': k, 'value': v, 'metadata': m})}\n" for k, v, m in events))


def test_runs_converging_like_the_reference_pass_and_implausibly_fast_ones_fail(tmp_path):
    for name, epochs in (("like", [18, 17, 18, 19, 18, 18, 17, 18, 18, 19]), ("fast", [5] * 10)):
        folder = tmp_path / name
        folder.mkdir()
        for i, e in enumerate(epochs):
            _result(folder / f"result_{i}.txt", 128, e)
        verdict = rcp_check(folder, tmp_path / f"{name}.log")
        assert verdict["passed"] == (name == "like"), verdict
        assert verdict["message"].startswith("RCP ") and (tmp_path / f"{name}.log").is_file()
    assert _rcp_line(verdict).startswith("- RCP checker: failed: RCP ")
    assert "not run" in _rcp_line(None)
