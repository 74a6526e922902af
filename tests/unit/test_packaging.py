"""The installed distribution: console scripts that resolve to each tool's main, its licence and requirements.

These read what pip installed (importlib.metadata), so they fail until the project is reinstalled after
setup.py changes: `pip install -c constraints.txt --no-build-isolation -e ".[test]"` (scripts/setup.sh).
"""
import importlib.metadata
import inspect

import pytest

DISTRIBUTION = "hpc-sciml-bench"
SCRIPTS = {  # console script: the main() its `python -m` form runs
    "sciml-data-prep": "data_prep.__main__:main",
    "sciml-train-cosmoflow": "cosmoflow.train:main",
    "sciml-train-deepcam": "deepcam.train:main",
    "sciml-campaign": "common.campaign.run:main",
    "sciml-report": "common.campaign.analysis.__main__:main",
    "sciml-jobs": "jobs.__main__:main",
    "sciml-export": "common.export:main",
    "sciml-hpo": "common.hpo.__main__:main",
}
REINSTALL = 'reinstall the project: pip install -c constraints.txt --no-build-isolation -e ".[test]"'


def _installed_scripts() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.distribution(DISTRIBUTION).entry_points
            if ep.group == "console_scripts"}


def test_every_console_script_is_installed_and_no_other():
    assert set(_installed_scripts()) == set(SCRIPTS), REINSTALL


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_console_script_resolves_to_a_main_taking_argv(name):
    entry = _installed_scripts().get(name)
    assert entry is not None, f"{name} is not installed; {REINSTALL}"
    assert entry.value == SCRIPTS[name]
    main = entry.load()
    assert callable(main)
    argv = inspect.signature(main).parameters.get("argv")
    assert argv is not None and argv.default is None, f"{entry.value} must take argv=None"
    module = importlib.import_module(entry.module)
    assert getattr(module, entry.attr) is main


def test_licence_and_requirements():
    metadata = importlib.metadata.metadata(DISTRIBUTION)
    assert metadata["License"] == "Apache-2.0"
    requires = importlib.metadata.requires(DISTRIBUTION)
    by_name = {r.split(";")[0].split("==")[0].strip(): r for r in requires}
    for test_only in ("pytest", "hypothesis"):
        assert 'extra == "test"' in by_name[test_only], f"{test_only} belongs to the `test` extra only"
    assert by_name["google-crc32c"] == "google-crc32c==1.9.0"
    assert "test" in metadata.get_all("Provides-Extra")
