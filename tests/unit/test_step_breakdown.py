"""benchmarks/step_breakdown.py: a profiler trace's op seconds summed by kind of op."""
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import step_breakdown  # noqa: E402  (a script beside the benchmarks, not a package)


def trace(events, line_name="tf_Compute/1"):
    """An XSpace-shaped object: one plane, one line, `events` as (metadata name, seconds)."""
    metadata = {i: types.SimpleNamespace(name=name) for i, (name, _) in enumerate(events)}
    line = types.SimpleNamespace(name=line_name, events=[
        types.SimpleNamespace(metadata_id=i, duration_ps=int(s * 1e12)) for i, (_, s) in enumerate(events)])
    return types.SimpleNamespace(planes=[types.SimpleNamespace(lines=[line], event_metadata=metadata)])


def test_ops_are_summed_by_kind_and_the_executors_enclosing_event_is_not_an_op():
    xspace = trace([("ExecutorState::Process", 1.0), ("model/conv1/Conv3D:_MklNativeConv3D", 0.25),
                    ("gradient_tape/model/conv1/Conv3DBackpropFilterV2:Conv3DBackpropFilterV2", 0.125),
                    ("model/pool1/MaxPool3D:MaxPool3D", 0.0625), ("model/act/LeakyRelu:LeakyRelu", 0.5),
                    ("Cast:Cast", 0.03125)])
    table, others = step_breakdown.op_seconds(xspace)
    assert table == {"conv_forward": 0.25, "conv_weight_gradient": 0.125, "pooling": 0.0625, "other": 0.5,
                     "cast": 0.03125}
    assert others == {"LeakyRelu": 0.5}


def test_only_tensorflows_op_threads_count():
    assert step_breakdown.op_seconds(trace([("a/MatMul:MatMul", 1.0)], line_name="python"))[0] == {}
