"""The one strict reader and writer of the JSON and YAML documents the suite writes: configs, dataset manifests,
checkpoint meta.json, pack.json, staging stamps, campaign and HPO specs, run records.

A document is declared as (frozen) dataclasses. `read(path, Schema)` parses the file and `build`s the schema from
it: unknown keys, missing keys, wrong types and values out of a Literal's choices are refused with a BenchError
naming the file, the dotted key (`progress.history[2].epoch`), the value and what was expected. Ranges and checks
across fields live in each dataclass's `__post_init__`, raising through `check`, whose key is then placed where
the dataclass sits in the document. `write(path, obj)` writes one atomically (temporary name, then rename).

Types a schema may use: nested dataclasses, list[X], tuple[X, ...] and fixed tuples, dict[str, X], X | None, unions
of scalars (int | float keeps an integer an integer), Literal[...] (a choice set), int (a bool is none; within int64;
Annotated[int, AtLeast(n)] refuses less than n), float (finite; `NAN_OK` admits NaN and infinities), str, bool, bare
dict / list (any JSON object / array), and Any. A field whose metadata is `REQUIRED` must be in the
document, and not null, even though the constructor gives it a default (None for values computed later); one whose
metadata is `NOT_STORED` is neither read nor written (the reader sets it, such as a manifest's directory); one whose
metadata is `OMITTED` is written only when set (not None, not empty), so documents that do not use it keep their form.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from common.base.errors import BenchError
from common.base.files import write_text_atomic

T = TypeVar("T")
INT_LIMIT = 2 ** 63  # integers are int64 wherever they go
NAN_OK = "nan-ok"  # Annotated[float, NAN_OK]: a figure that may be NaN or infinite (an evaluation can give one)
REQUIRED = {"document": "required"}
NOT_STORED = {"document": "not stored"}
OMITTED = {"document": "omitted when unset"}
Figure = typing.Annotated[float, NAN_OK]


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """Annotated[int, AtLeast(0)]: a value the reader refuses below `minimum` (where the dataclass itself may
    hold a marker below it in memory, as an index size not known yet)."""

    minimum: int


Count = typing.Annotated[int, AtLeast(0)]  # a count or a size in a document


class Refused(BenchError):
    """A value refused at `key` (dotted, relative to the dataclass that raised it until `build` places it)."""

    def __init__(self, key: str, value: Any, expected: str, noun: str = "key"):
        self.key, self.value, self.expected, self.noun = key, value, expected, noun
        super().__init__(f"{noun} {key} = {show(value)}: expected {expected}")


def check(ok: bool, key: str, value: Any, expected: str, noun: str = "key") -> None:
    """Raise `Refused` naming the key, its value and what was expected, unless `ok`."""
    if not ok:
        raise Refused(key, value, expected, noun)


def show(value: Any) -> str:
    """A value for a message: its repr (control characters and surrogates escaped), at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# ---------------------------------------------------------------------------- reading
def read(path: str | os.PathLike, schema: type[T], kind: str | None = None, what: str = "", **given: Any) -> T:
    """The document at `path` as a `schema` instance; `kind` "json" or "yaml" (None: by the suffix, .yaml/.yml
    are YAML). `what` names the document in the message for a missing file; `given`: the values of the schema's
    NOT_STORED fields. Raises BenchError naming the file."""
    path = Path(path)
    return build_from(path, load(path, kind, what), schema, **given)


def build_from(where: str | os.PathLike, raw: Any, schema: type[T], **given: Any) -> T:
    """`build` of a document already parsed, its errors prefixed with `where` (the file it came from)."""
    try:
        return build(schema, raw, given=given)
    except BenchError as err:
        raise BenchError(f"{where}: {err}") from None


def load(path: str | os.PathLike, kind: str | None = None, what: str = "") -> Any:
    """The parsed JSON or YAML at `path`, not yet checked against a schema."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file{f' ({what})' if what else ''}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"{path}: not readable UTF-8 text ({err})") from None
    return parse(text, kind or kind_of(path), str(path))


def kind_of(path: Path) -> str:
    return "yaml" if path.suffix in (".yaml", ".yml") else "json"


def parse(text: str, kind: str, where: str) -> Any:
    """JSON or YAML text as Python values; a BenchError naming `where` for text that is neither."""
    try:
        return yaml.safe_load(text) if kind == "yaml" else json.loads(text)
    except (yaml.YAMLError, ValueError) as err:  # ValueError: bad JSON, an integer of > 4300 digits
        raise BenchError(f"{where}: not readable {kind.upper()} ({err})") from None
    except RecursionError:
        raise BenchError(f"{where}: not readable {kind.upper()} (nested too deeply)") from None


def build(schema: type[T], raw: Any, prefix: str = "", strict: bool = True, given: dict | None = None) -> T:
    """Build dataclass `schema` from nested dicts, refusing unknown and missing keys and wrong types.

    `prefix` is the dotted place of this mapping ("" for the top level), for messages. `strict` False accepts
    what YAML configs write loosely: a number for a string, a scalar for a one-item tuple, a float YAML 1.1
    left as text (1e12). `given`: values of the top level's NOT_STORED fields."""
    if given:
        return _dataclass(schema, strict, tuple(given.items()))(raw, prefix.rstrip("."))
    return _converter(schema, strict)(raw, prefix.rstrip("."))


Convert = Callable[[Any, str], Any]


@functools.lru_cache(maxsize=None)
def _converter(tp: Any, strict: bool) -> Convert:
    """The function that checks and converts a value of type `tp` at a dotted key."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        if args[0] is float and NAN_OK in args[1:]:
            return _float(strict, nan_ok=True)
        return _bounded(_converter(args[0], strict), [a for a in args[1:] if isinstance(a, AtLeast)])
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, strict)
    if origin in (typing.Union, types.UnionType):
        return _union(args, strict)
    if origin is typing.Literal:
        return _literal(args)
    if origin in (list, tuple) or tp in (list, tuple):
        return _sequence(tp, origin or tp, args, strict)
    if origin is dict or tp is dict:
        return _mapping(args, strict)
    return _scalar(tp, strict)


def _bounded(conv: Convert, bounds: list[AtLeast]) -> Convert:
    if not bounds:
        return conv

    def convert(value: Any, key: str) -> Any:
        value = conv(value, key)
        for bound in bounds:
            check(value >= bound.minimum, key, value, f"an integer >= {bound.minimum}")
        return value
    return convert


def describe(tp: Any) -> str:
    """What a value of type `tp` must be, for messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        bounds = [a for a in args[1:] if isinstance(a, AtLeast)]
        if bounds:
            return f"an integer >= {bounds[0].minimum}"
        return "a number" if NAN_OK in args[1:] else describe(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if dataclasses.is_dataclass(tp) or origin is dict or tp is dict:
        return "a mapping"
    if origin in (list, tuple) or tp in (list, tuple):
        return "a list"
    return {int: "an integer in [-2^63, 2^63)", float: "a finite number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _join(key: str, name: Any) -> str:
    """The dotted key of `name` inside `key`; a name that is not printable text (a lone surrogate, a control
    character) as its repr, a long one cut to 80 characters, so that every message prints."""
    text = str(name)
    if not text.isprintable():
        text = repr(text)
    if len(text) > 80:
        text = f"{text[:77]}..."
    return f"{key}.{text}" if key else text


def _where(key: str) -> str:
    return f"section {key}" if key else "the top level"


def _need_mapping(value: Any, key: str, name: str) -> None:
    if not isinstance(value, dict):
        raise BenchError(f"{_where(key)}: expected a mapping for {name}, found {show(value)}")


def _unknown(raw: dict, names: list[str], key: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in names)  # YAML keys may be numbers, booleans, null
    if unknown:
        raise BenchError(f"{_where(key)}: unknown key(s) {', '.join(_join(key, k) for k in unknown)}; "
                         f"valid keys: {', '.join(names)}")


def _dataclass(schema: type, strict: bool, given: tuple = ()) -> Convert:
    hints = typing.get_type_hints(schema, include_extras=True)
    fields = [f for f in dataclasses.fields(schema) if _stored(f) and f.init]
    names, known = [f.name for f in fields], {f.name for f in fields}
    plan = [(f.name, _converter(hints[f.name], strict)) for f in fields]
    needed = {f.name for f in fields if f.metadata.get("document") == REQUIRED["document"]}  # and not null
    required = [f.name for f in fields if f.name in needed or (
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)]

    def convert(raw: Any, key: str) -> Any:
        if raw is None and not strict:
            raw = {}  # an empty YAML section: every default
        _need_mapping(raw, key, schema.__name__)
        if not known.issuperset(raw):
            _unknown(raw, names, key)
        missing = [name for name in required if raw.get(name) is None and (name not in raw or name in needed)]
        if missing:
            name = missing[0]
            expected = describe(hints[name]).removesuffix(" or null") if name in needed else describe(hints[name])
            raise BenchError(f"{_where(key)}: missing key {_join(key, name)}: expected {expected}")
        values = {name: conv(raw[name], _join(key, name)) for name, conv in plan if name in raw}
        values.update(given)
        try:
            return schema(**values)
        except Refused as err:  # a __post_init__ check: its key is relative to this dataclass
            raise Refused(_join(key, err.key) if err.noun == "key" else err.key, err.value, err.expected,
                          err.noun) from None
    return convert


def _stored(field: dataclasses.Field) -> bool:
    return field.metadata.get("document") != NOT_STORED["document"]


def _union(args: tuple, strict: bool) -> Convert:
    arms = [a for a in args if a is not type(None)]
    optional = len(arms) < len(args)
    converters = [_converter(a, strict) for a in arms]
    scalars = all(a in (int, float, str, bool) for a in arms)
    expected = " or ".join(describe(a) for a in args)

    def convert(value: Any, key: str) -> Any:
        if value is None and optional:
            return None
        if len(converters) == 1:
            return converters[0](value, key)
        for arm in arms if scalars else ():  # the arm the value already is: int | float keeps an int
            if type(value) is arm:
                return converters[arms.index(arm)](value, key)
        for conv in converters:
            try:
                return conv(value, key)
            except BenchError:
                continue
        raise Refused(key, value, expected)
    return convert


def _literal(choices: tuple) -> Convert:
    def convert(value: Any, key: str) -> Any:
        # `in` alone would take True for 1 and 1.0 for 1: the choice must be of the value's type too
        if not any(value == c and type(value) is type(c) for c in choices):
            raise Refused(key, value, f"one of {list(choices)}")
        return value
    return convert


def _sequence(tp: Any, origin: type, args: tuple, strict: bool) -> Convert:
    if not args:
        item, fixed = None, None
    elif origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        item, fixed = None, [_converter(a, strict) for a in args]
    else:
        item, fixed = _converter(args[0], strict), None

    def convert(value: Any, key: str) -> Any:
        if not isinstance(value, (list, tuple)):
            if strict or fixed is not None:
                raise Refused(key, value, f"a list{f' of {len(fixed)}' if fixed else ''}")
            value = [value]  # a config's `decay_epochs: 5`
        if fixed is not None:
            if len(value) != len(fixed):
                raise Refused(key, value, f"a list of {len(fixed)} items")
            items = [conv(v, f"{key}[{i}]") for i, (conv, v) in enumerate(zip(fixed, value))]
        elif item is None:
            items = list(value)
        else:
            items = [item(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    return convert


def _mapping(args: tuple, strict: bool) -> Convert:
    key_conv, value_conv = (_converter(args[0], strict), _converter(args[1], strict)) if args else (None, None)

    def convert(value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise Refused(key, value, "a mapping")
        if key_conv is None:
            return value
        return {key_conv(k, _join(key, k)): value_conv(v, _join(key, k)) for k, v in value.items()}
    return convert


def _scalar(tp: Any, strict: bool) -> Convert:
    if tp is Any or tp is object:
        return lambda value, key: value
    if tp is float:
        return _float(strict, nan_ok=False)
    if tp is int:
        return _int
    if tp in (str, bool, type(None)):
        return functools.partial(_exact, tp, strict)
    raise TypeError(f"documents cannot read a field of type {tp!r}")


def _int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -INT_LIMIT <= value < INT_LIMIT:
        return value
    raise Refused(key, value, describe(int))


def _exact(tp: type, strict: bool, value: Any, key: str) -> Any:
    if tp is str and not strict and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if type(value) is tp:
        return value
    raise Refused(key, value, describe(tp))


def _float(strict: bool, nan_ok: bool) -> Convert:
    def convert(value: Any, key: str) -> float:
        number = value
        if isinstance(value, str) and not strict:  # YAML 1.1 leaves 1e12 (no dot) as text
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise Refused(key, value, "a finite number" if not nan_ok else "a number")
        try:
            number = float(number)
        except OverflowError:  # an integer beyond float's range
            number = math.inf
        if not (nan_ok or math.isfinite(number)):
            raise Refused(key, value, "a finite number")
        return number
    return convert


# ---------------------------------------------------------------------------- writing
def to_dict(obj: Any) -> Any:
    """Plain nested dicts and lists of a dataclass (tuples as lists; NOT_STORED fields, and OMITTED ones unset,
    left out), for JSON and YAML."""
    if isinstance(obj, _SCALARS):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Manifests hold hundreds of thousands of entries (staging writes one's JSON form into its stamp in the
        # timed run): the field plan per class, no call per scalar.
        plain = {}
        for name, omitted in _plan(type(obj)):
            value = getattr(obj, name)
            if not (omitted and value in (None, {}, ())):
                plain[name] = value if isinstance(value, _SCALARS) else to_dict(value)
        return plain
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


_SCALARS = (str, int, float, bool, type(None))


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, bool], ...]:
    """The stored fields of a dataclass, each with whether it is OMITTED when unset."""
    return tuple((f.name, f.metadata.get("document") == OMITTED["document"]) for f in dataclasses.fields(cls)
                 if _stored(f))


def dumps(obj: Any, kind: str = "json", indent: int | None = 2) -> str:
    """The text of a document (a dataclass or plain values) as JSON or YAML."""
    plain = to_dict(obj)
    if kind == "yaml":
        return yaml.safe_dump(plain, sort_keys=False)
    return json.dumps(plain, indent=indent, default=float) + "\n"


def write(path: str | os.PathLike, obj: Any, kind: str | None = None, indent: int | None = 2) -> Path:
    """Write `obj` (a dataclass or plain values) as JSON or YAML (`kind`; None: by the suffix) to a temporary
    name beside `path`, then rename it into place; `indent` None: compact JSON."""
    path = Path(path)
    return write_text_atomic(dumps(obj, kind or kind_of(path), indent), path)
