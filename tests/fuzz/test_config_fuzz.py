"""Fuzzing the config loader (common/runtime/config.py with both applications' schemas).

Inputs: the shipped YAML configs with corrupted bytes or lines, their parsed form with one key set to a random
YAML value (or a new key), and random dotted overrides. Promise: a frozen config of the schema's type, or a
BenchError naming the file or the override; never another exception, a hang, or a config whose floats are not
finite or that does not survive being saved and loaded again.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
import typing
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from common.runtime.config import load_config, save_config
from cosmoflow.config import CosmoConfig
from deepcam.config import DeepCamConfig
from tests.fuzz.harness import corruptions, fuzz, outcome_of, time_limit, timed

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(REPO.glob("*/configs/*.yaml"))
SCHEMAS = {"cosmoflow": CosmoConfig, "deepcam": DeepCamConfig}
LIMIT_S = 10.0  # per input; loading a config takes milliseconds

# YAML values of every kind the loader may meet, keys included.
scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.just(10 ** 400) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["${run.name}", "1e12", "nan", "-inf", "0x10", "~", "yes"]))
edge_values = st.sampled_from([0, -1, 1, 2 ** 63, 10 ** 400, 0.0, -0.0, 1e308, math.nan, math.inf, -math.inf, "",
                               "nan", "1e999", True, None, [], {}, [1, 2, 3, 4], [0.5, 0.5]])
keys = st.text(max_size=10) | st.integers(-3, 3) | st.booleans() | st.none()
values = edge_values | st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=3), max_leaves=8)
yaml_syntax = st.sampled_from(list("[]{}:,&*!|>'\"%@`#-?\t\n")
                              + ["!!python/object:os.system", "&a [*a]", "...", "[" * 2000])


def key_paths(schema, prefix: str = "") -> list[str]:
    """Every dotted key of a config schema (sections and leaves)."""
    paths = []
    for field in dataclasses.fields(schema):
        path = prefix + field.name
        paths.append(path)
        tp = typing.get_type_hints(schema)[field.name]
        if dataclasses.is_dataclass(tp):
            paths += key_paths(tp, path + ".")
    return paths


def app_of(path: Path) -> str:
    return path.parent.parent.name


def load_checked(path: Path, overrides: list[str], schema) -> str:
    """Load and check the promise; returns the outcome for the tally."""
    with time_limit(LIMIT_S):
        outcome, value = outcome_of(lambda: load_config(path, overrides, schema))
    assert outcome != "crash", f"{path} with overrides {overrides}:\n{value}\ntext: {path.read_bytes()[:2000]!r}"
    if outcome == "BenchError":
        assert str(path) in value or any(o in value for o in overrides) or "override" in value, value
        return outcome
    assert isinstance(value, schema)
    bad = [(k, v) for k, v in _floats(value) if not math.isfinite(v)]
    assert not bad, f"non-finite floats {bad} accepted from {path.read_text()!r} {overrides}"
    with tempfile.TemporaryDirectory() as out:  # what a run saves is what it ran with
        again = load_config(save_config(value, out), [], schema)
    assert again == value, f"saved and reloaded config differs: {again} != {value}"
    return "valid config"


def _floats(obj, prefix: str = ""):
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            yield from _floats(value, f"{prefix}{field.name}.")
        for v in (value if isinstance(value, tuple) else (value,)):
            if isinstance(v, float):
                yield f"{prefix}{field.name}", v


@st.composite
def line_edits(draw, text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    edit = draw(st.sampled_from(["delete", "duplicate", "indent", "dedent", "inject"]))
    if edit == "delete":
        del lines[i]
    elif edit == "duplicate":
        lines.insert(i, lines[i])
    elif edit == "indent":
        lines[i] = "  " + lines[i]
    elif edit == "dedent":
        lines[i] = lines[i].lstrip()
    else:
        column = draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:column] + draw(yaml_syntax) + lines[i][column:]
    return "".join(lines)


@fuzz(examples=120, deadline_s=10)
@given(data=st.data(), shipped=st.sampled_from(SHIPPED))
def test_corrupted_config_text(data, shipped, tmp_path_factory):
    original = shipped.read_bytes()
    if data.draw(st.booleans(), label="bytes, not lines"):
        text = data.draw(corruptions(len(original)), label="corruption").apply(original)
    else:
        text = data.draw(line_edits(original.decode()), label="line edit").encode()
    path = tmp_path_factory.mktemp("cfg") / shipped.name
    path.write_bytes(text)
    with timed("config: corrupted text") as box:
        box[0] = load_checked(path, [], SCHEMAS[app_of(shipped)])


@fuzz(examples=120, deadline_s=10)
@given(data=st.data(), shipped=st.sampled_from(SHIPPED))
def test_random_values_and_keys(data, shipped, tmp_path_factory):
    schema = SCHEMAS[app_of(shipped)]
    raw = yaml.safe_load(shipped.read_text())
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        dotted = data.draw(st.sampled_from(key_paths(schema)) | st.text(min_size=1, max_size=12), label="key")
        node = raw
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            if data.draw(st.booleans(), label="delete"):
                node.pop(parts[-1], None)
            else:
                node[parts[-1]] = data.draw(values, label="value")
    if data.draw(st.booleans(), label="foreign top-level key"):
        raw[data.draw(keys, label="top key")] = data.draw(values, label="top value")
    path = tmp_path_factory.mktemp("cfg") / "edited.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    with timed("config: random values and keys") as box:
        box[0] = load_checked(path, [], schema)


@fuzz(examples=120, deadline_s=10)
@given(data=st.data(), shipped=st.sampled_from(SHIPPED))
def test_random_overrides(data, shipped):
    schema = SCHEMAS[app_of(shipped)]
    key = st.sampled_from(key_paths(schema)) | st.text(max_size=12)
    text = (values.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("..."))
            | st.text(max_size=16) | yaml_syntax)
    override = st.tuples(key, st.sampled_from(["=", "=", " = ", ""]), text).map("".join)
    overrides = data.draw(st.lists(override, max_size=3), label="overrides")
    with timed("config: random overrides") as box:
        box[0] = load_checked(shipped, overrides, schema)
