"""The mesh benchmark's arithmetic and case parsing (the measurements themselves are benchmarks/mesh_throughput.py's)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import mesh_throughput as mt  # noqa: E402  (a script beside harness.py, not a package)


def test_halo_bytes_count_both_directions_of_every_internal_boundary_while_split():
    # depth split in 2: layer 0 sends 1 plane of 8x8x2 each way; the 4-deep blocks pool, so layer 1
    # (4x4x4x3) is still split and sends 1 plane of 4x4x3 each way.
    assert mt.halo_bytes_per_sample((8, 8, 8, 2), (3, 5), (2, 1), pool_size=2, kernel=3) == 4 * (2 * 64 * 2 + 2 * 16 * 3)
    # depth and height split: each split dimension's planes span the other, whole, dimensions, and each of the
    # 4 blocks takes one corner row (width x channels) from its diagonal neighbour.
    assert mt.halo_bytes_per_sample((4, 4, 4, 1), (1, 1), (2, 2), pool_size=2, kernel=3) == 4 * ((32 + 32 + 16) + (8 + 8 + 8))
    # 3-deep blocks cannot pool by 2: the split is merged after layer 0 and layer 1 exchanges nothing.
    assert mt.halo_bytes_per_sample((6, 6, 6, 1), (1, 1), (2, 1), pool_size=2, kernel=3) == 4 * 2 * 36
    # a kernel of 5 sends two planes; 4 partitions have 3 internal boundaries; no split, no halo.
    assert mt.halo_bytes_per_sample((8, 8, 8, 1), (1,), (4, 1), pool_size=2, kernel=5) == 4 * 2 * 3 * 2 * 64
    assert mt.halo_bytes_per_sample((8, 8, 8, 1), (1,), (1, 1), pool_size=2, kernel=3) == 0


def test_conv_macs_count_each_face_once_and_merged_layers_on_every_device():
    # 4^3 x 1 -> 1 filter, depth in 2: the cube's 4*4*4*27 multiply-adds, plus one kernel face (9 taps) over a
    # 4x4 plane for each of the 2 directions of the one internal boundary.
    assert mt.conv_macs_ratio((4, 4, 4, 1), (1,), (2, 1), pool_size=2, kernel=3) == pytest.approx(1 + 2 * 16 * 9 / 1728)
    # 3-deep blocks cannot pool by 2: layer 1 (3^3, merged) runs whole on both devices.
    assert mt.conv_macs_ratio((6, 6, 6, 1), (1, 1), (2, 1), pool_size=2, kernel=3) == pytest.approx(
        (216 * 27 + 2 * 36 * 9 + 2 * 27 * 27) / (216 * 27 + 27 * 27))
    # another kernel: the blocks grow by their halos (2 planes each side for 5), and their outputs are computed.
    assert mt.conv_macs_ratio((8, 8, 8, 1), (1,), (2, 1), pool_size=2, kernel=5) == pytest.approx((8 + 8) / 8)
    assert mt.conv_macs_ratio((8, 8, 8, 1), (1, 1), (1, 1), pool_size=2, kernel=3) == 1.0


def test_cases_parse_and_refuse_ranks_the_partitions_do_not_divide():
    case = mt.Case.parse("4:2x1")
    assert (case.ranks, case.spatial, case.groups, case.label) == (4, (2, 1), 2, "4:2x1")
    assert mt.Case.parse("2:1x1").groups == 2
    with pytest.raises(argparse.ArgumentTypeError, match=r"case '3:2x1': 3 ranks are not divisible by 2"):
        mt.Case.parse("3:2x1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected RANKS:PDxPH"):
        mt.Case.parse("4-2x1")
    batched = mt.Case.parse("4:2x2@4")
    assert (batched.spatial, batched.local_batch, batched.label) == ((2, 2), 4, "4:2x2@4")
    assert mt.Case.parse("4:2x2").local_batch is None
    with pytest.raises(argparse.ArgumentTypeError, match=r"RANKS:PDxPH@BATCH"):
        mt.Case.parse("4:2x2@0")


def test_loopback_and_memory_readings_are_live():
    before = mt.loopback_bytes()
    assert before >= 0 and mt.loopback_bytes() >= before
    assert 0 < mt.rss_mb() <= mt.peak_rss_mb() * 1.01


def test_each_run_gives_a_case_record_in_the_issue_s_form():
    run = {"input_shape": [128, 128, 128, 4], "spatial": [2, 2], "ranks": 4, "local_batch": 4,
           "peak_rss_mb_per_rank": [1833.0, 1493.0, 1512.0, 1550.0], "samples_per_second": 0.32}
    assert mt.case_record(run) == {"sample": 128, "layout": "2x2", "ranks": 4, "local_batch": 4,
                                   "peak_rss_mb": [1833.0, 1493.0, 1512.0, 1550.0], "samples_per_second": 0.32}
    assert mt.case_record({**run, "spatial": [1, 1]})["layout"] == "data"


def test_a_run_of_some_sizes_keeps_the_other_sizes_runs_with_their_own_header(tmp_path):
    import json
    path = tmp_path / "mesh.json"
    run = {"size": "full", "case": "2:1x1", "input_shape": [128, 128, 128, 4], "spatial": [1, 1], "ranks": 2,
           "local_batch": 1, "peak_rss_mb_per_rank": [1.0, 2.0], "samples_per_second": 0.5}
    old = {"date": "2026-11-20", "machine": "m", "sgemm_gflops": 100.0, "runs": [run, {**run, "size": "mini"}]}
    path.write_text(json.dumps(old))
    new = {**run, "size": "256", "input_shape": [256, 256, 256, 4]}
    header = {"date": "2026-11-26", "machine": "m", "sgemm_gflops": 150.0}
    result = mt.merged_result(path, [new, {**new, "size": "mini"}], header, ["256", "mini"])
    assert [r["size"] for r in result["runs"]] == ["mini", "full", "256"]  # the sizes' order; old mini replaced
    assert result["sizes"]["full"]["date"] == "2026-11-20" and result["sizes"]["256"]["date"] == "2026-11-26"
    assert [c["sample"] for c in result["cases"]] == [256, 128, 256]


def test_the_profile_sorts_ops_into_kinds_gradients_apart():
    import mesh_profile as mp
    assert mp.kind_of("_MklNativeConv3D") == "conv" and mp.kind_of("Conv3D") == "conv"
    assert mp.kind_of("_MklNativeConv3DBackpropFilterV2") == "conv_grad_filter"
    assert mp.kind_of("Conv3DBackpropInputV2") == "conv_grad_input"
    assert mp.kind_of("_MklNativeMaxPool3DGrad") == "pool_grad" and mp.kind_of("_MklNativeMaxPool3D") == "pool"
    assert mp.kind_of("LeakyReluGrad") == "leaky_relu_grad" and mp.kind_of("ConcatV2") == "halo_and_padding"
    assert mp.kind_of("AddV2") == "other"


def test_cycle_table_compares_each_case_with_its_own_1ms_run():
    import horovod_cycle as hc

    def run(case, layout, controller, cycle, sps, size="full"):
        return {"size": size, "case": case, "layout": layout, "controller": controller, "cycle_time_ms": cycle,
                "ranks": 2, "local_batch": 4, "input_shape": [128, 128, 128, 4], "median_step_seconds": 8 / sps,
                "samples_per_second": sps, "cpu_seconds_per_step_per_rank": [{"user": 1.0, "system": 0.25}] * 2}

    result = {"date": "2026-11-26", "machine": "vm 2 cores", "sgemm_gflops": 100.0,
              "runs": [run("2:1x1@4", "data", "mpi", 1, 0.5), run("2:1x1@4", "data", "mpi", 10, 0.6),
                       run("2:2x1@4", "2x1", "mpi", 10, 0.4), run("2:1x1@4", "data", "gloo", 10, 0.7)]}
    rows = hc.table_rows(result)
    assert "| mpi | 10 | 13.333 | 0.60 | 1.20 | 1.00 + 0.25, 1.00 + 0.25 |" in rows[3]
    assert "hybrid 2x1" in rows[4] and rows[4].split("|")[7].strip() == "-"  # no 1 ms run of that case
    assert rows[5].split("|")[7].strip() == "-"  # gloo is not compared with mpi's 1 ms run
