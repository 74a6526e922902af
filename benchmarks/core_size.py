"""How much of the suite a reader meets on the plain CosmoFlow path (issue 46's figures), saved as JSON.

    python benchmarks/core_size.py [--data DIR] [--out benchmarks/results/core_size.json]

One single-process, one-epoch CosmoFlow mini run (cosmoflow/configs/cosmo_mini.yaml, no staging) under a tracer
gives the suite's files whose code runs once train() is called (`files`), their lines in all (`file_lines`) and the
distinct lines of them that ran (`executed_lines`, as coverage counts them), and the same of every suite file the
run imports (`imported_*`: module top levels count, as under coverage); the stack at the first
`GradientTape.gradient` gives the suite's frames from `train()` to the frame that asks for the gradient; an AST walk
gives the types (classes) defined in common/runtime/loop.py and in common/runtime/; per file run, the functions
and methods none of whose body ran (`unrun_functions`), and over the files run their lines by kind
(`line_kinds`: blank, comment, docstring, code of statements that ran and that did not; the last is all that
moving unused code out could take from them). Without --data a tiny dataset
(16 + 4 synthetic 64^3 universes cut into 32^3 samples) is generated in a temporary directory.
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = ("common", "cosmoflow", "deepcam", "data_prep", "jobs")  # the suite's packages (not tests/, benchmarks/)
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def suite_file(filename: str) -> str | None:
    """The repository-relative path of a suite source file, else None."""
    try:
        rel = Path(filename).resolve().relative_to(REPO)
    except ValueError:
        return None
    return str(rel) if rel.parts[0] in SUITE and rel.suffix == ".py" else None


class CallTracer:
    """Records the suite's files whose code runs (a module's top level or any function in it) and the lines of
    them that run, in every thread. Only the suite's own frames are traced line by line; code tf.function runs as
    autograph's converted copy (a generated file) is not the suite's, so its lines are not counted."""

    def __init__(self):
        self.lines: dict[str, set[int]] = {}
        self.called: set[str] = set()  # files a function of which ran once `training` was set (imports done)
        self.training = False
        # file name -> its repository-relative path, or None (keyed by name: code objects compare by value, so
        # two empty modules' code objects are equal whatever their files)
        self.where: dict[str, str | None] = {}

    def _trace(self, frame, event, _arg):
        name = frame.f_code.co_filename
        if name not in self.where:
            self.where[name] = suite_file(name)
        rel = self.where[name]
        if rel is None:
            return None
        self.lines.setdefault(rel, set()).add(frame.f_lineno)
        if self.training:
            self.called.add(rel)
        return self._line

    def _line(self, frame, event, _arg):
        if event == "line":
            self.lines[self.where[frame.f_code.co_filename]].add(frame.f_lineno)
        return self._line

    def __enter__(self):
        threading.settrace(self._trace)
        sys.settrace(self._trace)
        return self

    def __exit__(self, *_exc):
        sys.settrace(None)
        threading.settrace(None)


def frames_to_gradient() -> dict:
    """Patch tf.GradientTape.gradient to record the suite's frames below train() at its first call."""
    import inspect
    import tensorflow as tf
    original, seen = tf.GradientTape.gradient, {}

    def gradient(self, *args, **kwargs):
        if not seen:
            frames = inspect.stack()[1:]
            names = [f"{suite_file(f.filename)}:{f.function}" for f in reversed(frames) if suite_file(f.filename)]
            start = next(i for i, n in enumerate(names) if n.endswith("cosmoflow/train.py:train"))
            # tf.function runs the suite's function as autograph's converted copy (tf__<name>, in a generated file)
            converted = [f.function for f in frames if f.function.startswith("tf__") and not suite_file(f.filename)]
            seen["chain"] = names[start:] + [f"{converted[0][4:]} (autograph's copy)"][:len(converted)]
        return original(self, *args, **kwargs)
    tf.GradientTape.gradient = gradient
    return seen


def tiny_dataset(root: Path) -> Path:
    """16 + 4 synthetic universes (64^3) cut into 32^3 samples: data_prep's own commands."""
    py = sys.executable
    subprocess.run([py, "-m", "data_prep", "cosmo-synth", "--out", str(root / "raw"), "--universes", "20", "--size",
                    "64", "--prior", "mini", "--seed", "7"], check=True, cwd=REPO)
    subprocess.run([py, "-m", "data_prep", "cosmo-convert", "--input", str(root / "raw"), "--out",
                    str(root / "tfrecords"), "--sample-size", "32", "--val-universes", "4", "--seed", "7"],
                   check=True, cwd=REPO)
    return root / "tfrecords"


def unrun_functions(path: Path, ran: set[int]) -> dict[str, int]:
    """The functions and methods of a file none of whose body lines ran, with their lengths in lines (a reader's
    map of what the plain path carries without using)."""
    found, tree = {}, ast.parse(path.read_text())
    members = [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body]
    for node in tree.body + members:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = range(node.body[0].lineno, node.end_lineno + 1)
            if not ran.intersection(body):
                found[f"{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    return found


def line_kinds(path: Path, ran: set[int]) -> dict[str, int]:
    """A file's lines by kind: blank, comment, docstring, and code in statements that ran or did not (a statement's
    lines take its first line's verdict, an inner statement's over its enclosing one's). `code_unrun` is all that
    moving unused code out of the file could take from it."""
    text = path.read_text()
    lines, tree = text.splitlines(), ast.parse(text)
    kind = {i: "blank" if not l.strip() else "comment" if l.strip().startswith("#") else None
            for i, l in enumerate(lines, 1)}
    status: dict[int, str] = {}
    for node in ast.walk(tree):  # breadth first: enclosing statements before the ones inside them
        if isinstance(node, ast.stmt):
            verdict = "code_run" if node.lineno in ran else "code_unrun"
            status.update(dict.fromkeys(range(node.lineno, node.end_lineno + 1), verdict))
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and \
                isinstance(body[0].value.value, str):
            kind.update(dict.fromkeys(range(body[0].lineno, body[0].end_lineno + 1), "docstring"))
    counts = dict.fromkeys(("code_run", "code_unrun", "docstring", "comment", "blank"), 0)
    for i, k in kind.items():
        counts[k or status.get(i, "code_run")] += 1
    return counts


def line_kinds_of(files: dict, ran: dict[str, set[int]]) -> dict[str, int]:
    """`line_kinds` summed over the files run."""
    total: dict[str, int] = {}
    for rel in files:
        for k, n in line_kinds(REPO / rel, ran[rel]).items():
            total[k] = total.get(k, 0) + n
    return total


def classes(path: Path) -> list[str]:
    return [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]


def measure(data: Path, out_dir: Path) -> dict:
    """The run imports the suite under the tracer (as coverage would see it): `imported_*` count the files whose
    code ran at all, module top levels included; `files` those whose code ran once train() was called."""
    chain = frames_to_gradient()
    overrides = [f"data.dir={data}", f"run.output_dir={out_dir}", "train.max_epochs=1", "train.target=0.0",
                 "mlperf.platform=core-size"]
    with CallTracer() as tracer:
        try:
            from common.runtime.dist import StopRequests
        except ImportError:  # a commit before stopping.py joined dist.py (measuring an older commit)
            from common.runtime.stopping import StopRequests
        from cosmoflow.train import train
        tracer.training = True
        code = train(str(REPO / "cosmoflow/configs/cosmo_mini.yaml"), overrides, StopRequests())
    lines = {rel: len((REPO / rel).read_text().splitlines()) for rel in sorted(tracer.lines)}
    files = {rel: n for rel, n in lines.items() if rel in tracer.called}
    executed = {rel: len(tracer.lines[rel]) for rel in lines}
    runtime = {p.name: classes(p) for p in sorted((REPO / "common/runtime").glob("*.py"))}
    return {"exit_code": code, "files": len(files), "file_lines": sum(files.values()),
            "executed_lines": sum(executed[rel] for rel in files), "imported_files": len(lines),
            "imported_file_lines": sum(lines.values()), "imported_executed_lines": sum(executed.values()),
            "per_file": files, "executed_per_file": executed,
            "unrun_functions": {rel: unrun_functions(REPO / rel, tracer.lines[rel]) for rel in files},
            "line_kinds": line_kinds_of(files, tracer.lines),
            "frames_to_gradient": len(chain.get("chain", [])) - 1, "gradient_chain": chain.get("chain", []),
            "loop_types": classes(REPO / "common/runtime/loop.py"),
            "runtime_types": sum(len(v) for v in runtime.values()), "runtime_types_by_file": runtime}


def main(argv=None) -> int:
    from harness import run_header, sgemm_gflops, write_json_atomic
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a CosmoFlow mini dataset (its tfrecords directory)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/core_size.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or tiny_dataset(Path(tmp) / "data")
        result = run_header(sgemm_gflops()) | measure(data, Path(tmp) / "run")
    write_json_atomic(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_file", "executed_per_file", "runtime_types_by_file", "unrun_functions")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
