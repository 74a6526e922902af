"""Bad input that commands once accepted or crashed on (issue 47 §3): each is refused with exit 2 and a message
naming the value and what was expected, before any work starts."""
import sys
from pathlib import Path

import pytest

from common.base import exits
from common.campaign.run import main as campaign_main
from common.hpo.space import __doc__ as SPACE_DOC, load_space
from common.base.errors import BenchError
from jobs.__main__ import main as jobs_main
from tests.conftest import REPO

SPACE = "\n".join(line[4:] for line in SPACE_DOC.split("\n\n")[1].splitlines())  # the documented example


@pytest.mark.parametrize("flag, value", [("--runs", "-3"), ("--instances", "-2"), ("--trials", "-1")])
def test_jobs_render_refuses_negative_counts(capsys, flag, value):
    code = jobs_main(["render", "--site", "localhost", "--bench", "cosmoflow", "--nodes", "1", flag, value])
    err = capsys.readouterr().err
    assert code == exits.BAD_INPUT and f"{flag} {value}: expected an integer >= 0" in err and "Traceback" not in err


@pytest.mark.parametrize("old, new, words", [
    ("seed: 1000", "seed: abc", ["seed", "'abc'", "an integer"]),
    ("failure_penalty: 2.0", "failure_penalty: high", ["failure_penalty", "'high'", "a finite number"]),
    ("warmup_epochs: 1}", "warmup_epochs: null}", ["pruner.warmup_epochs", "None", "a finite number"]),
    ("seed: 1,", "seed: [1],", ["sampler.seed", "[1]", "an integer"]),
    ("seed: 1000", "seed: -5", ["seed", "-5", "[0, 2^31)"]),
])
def test_search_space_values_of_the_wrong_kind_are_refused_naming_the_key(tmp_path, old, new, words):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace(old, new, 1))
    with pytest.raises(BenchError) as err:
        load_space(path)
    assert str(path) in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


def test_a_campaign_with_a_bad_override_is_refused_before_its_first_run(tmp_path, capsys):
    out = tmp_path / "campaign"
    code = campaign_main(["run", "cosmoflow", str(REPO / "cosmoflow/configs/cosmo_mini.yaml"), "--out", str(out),
                          "--runs", "3", "--np", "1", "--launcher", "", "--python", sys.executable,
                          "model.kernel_size=0"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == exits.BAD_INPUT and "would refuse their config" in err and "model.kernel_size = 0" in err, err
    assert not (out / "runs").exists()  # no run started


@pytest.mark.parametrize("out, words", [("/dev/null", "neither a file nor a directory"),
                                        ("/no-such-dir/x.sh", "directory /no-such-dir does not exist"),
                                        ("/tmp", "a directory")])
def test_jobs_render_writes_its_script_only_to_a_file_path(capsys, out, words):
    code = jobs_main(["render", "--site", "localhost", "--bench", "cosmoflow", "--nodes", "1", "--out", out])
    err = " ".join(capsys.readouterr().err.split())
    assert code == exits.BAD_INPUT and words in err and "Traceback" not in err, err
    assert Path("/dev/null").is_char_device()  # never replaced by a rename


def test_an_atomic_write_refuses_to_replace_a_device_or_a_path_without_a_name(tmp_path):
    from common.base.files import write_text_atomic
    for target in ("/dev/null", "/", str(tmp_path) + "/.."):
        with pytest.raises(BenchError):
            write_text_atomic("x", target)
    assert Path("/dev/null").is_char_device()
    assert write_text_atomic("x", tmp_path / "a.txt").read_text() == "x"


def test_a_site_file_that_is_not_utf8_is_bad_input(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_bytes("name: caf\xe9\n".encode("latin-1"))
    code = jobs_main(["render", "--site", str(site), "--bench", "cosmoflow", "--nodes", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == exits.BAD_INPUT and f"site file {site} is not UTF-8 text" in err and "Traceback" not in err, err
