"""Accuracy against the GPU memory Megatron-LM's own CI measured (tests/data/megatron-ci-dev.tsv.gz,
recorded from ../shared/calibration: tests/data/megatron-ci-dev.tsv.md).

Runs scripts/calibrate's logic over every row: the estimate of the LAST pipeline stage's
``allocated_peak_bytes`` against the measured ``torch.cuda.max_memory_allocated`` of global
rank world_size - 1.  The thresholds are the issues' targets where the estimator meets them,
and the achieved figures (as regression guards) where it does not; each exception is named.
"""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from conftest import CALIBRATION_TSV, load_script, shared_file


@pytest.fixture(scope="module")
def results(calibration_rows):
    calibrate = load_script("calibrate")
    out = []
    for row in calibration_rows:
        verdict, measured = calibrate.estimate_row(row)
        error = None
        if verdict.estimate is not None:
            error = (verdict.estimate.stages[-1].allocated_peak_bytes - measured) / measured
        argv = json.loads(row["argv_json"])
        out.append({"name": row["test_case"], "features": calibrate.features_of(argv, row["test_case"]),
                    "stack": calibrate.stack_of(row), "golden_file": row["golden_file"],
                    "error": error})
    return out


def stats(errors):
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(round(0.9 * (len(absolute) - 1))))]
    return statistics.median(absolute), p90, min(errors)


def test_every_row_is_estimated(results):
    assert sum(r["error"] is not None for r in results) / len(results) >= 0.90
    assert all(r["error"] is not None for r in results)


def test_dense_rows_meet_the_first_target(results):
    # Dense (gpt/) rows without resume or FSDP: median <= 10%, p90 <= 25%, no underestimate
    # beyond 15%.
    rows = [r for r in results if r["name"].startswith("gpt/") and not {"resume", "fsdp"} & set(r["features"])]
    median, p90, worst = stats([r["error"] for r in rows])
    assert median <= 0.10 and p90 <= 0.25 and worst >= -0.15


def test_all_rows(results):
    # Every row (issue targets): median <= 5%, p90 <= 12%; achieved 1.3% and 3.5%, guarded.
    median, p90, worst = stats([r["error"] for r in results])
    assert median <= 0.015
    assert p90 <= 0.04
    assert {r["stack"] for r in results} == {"dev", "lts", "lts before #2157"}
    for stack in ("dev", "lts", "lts before #2157"):
        assert stats([r["error"] for r in results if r["stack"] == stack])[1] <= 0.12, stack


def test_the_lts_image_before_2157_measured_unfused_attention(results):
    # scripts/calibrate STACK_FACTS: with no flash-attn in the NGC 24.01 LTS image, its
    # deterministic A100 runs are estimated with Transformer Engine's unfused fallback; every
    # one of its rows lands within -3.2% to +10.0%, where the flash estimate would be 19-43% under.
    rows = [r["error"] for r in results if r["stack"] == "lts before #2157"]
    assert len(rows) == 61
    assert min(rows) >= -0.04 and max(rows) <= 0.101


# Rows underestimated by more than 10%, each with the evidence for why.  The test fails when another
# row joins them (a regression) or one leaves (then remove it here).
UNDERESTIMATED = {
    # Measured 2026-01-15 (scripts/golden-provenance.tsv), the only rerun of this Megatron-FSDP
    # test, on the software of that time: the first run's golden values written the same day
    # measured 3.48 GB peak and 1.67 GB after each step, against 2.59-2.60 GB and 0.79 GB on
    # every measurement before (2025-10-31) and since (2026-03-05, within 4.1% of the
    # estimate).  The rerun: 4.56 GB peak, 2.79 GB after each step.
    ("moe/gpt3_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router",
     "golden_values_dev_dgx_h100_2nd.json"),
    # Measured 2025-11-06 (scripts/golden-provenance.tsv) on the software of that time, before
    # the test's flags changed (async save, data path); the same test on H100 measured
    # 4,289 MB then and 4,061-4,070 MB on every rewrite since 2026-01-15, when the estimate
    # is within 1% of H100 and GB200.
    ("moe/gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4", "golden_values_dev.json"),
}


def test_resumed_runs_count_the_fully_parallel_loads_buffers(results):
    # memory/checkpoint.py: the multi-instance MoE rerun keeps 0.82 GB of broadcast buffers
    # from --ckpt-fully-parallel-load into its first step.  An upper bound: H100 kept them
    # all, GB200 43% of them.  Every other rerun exchanges nothing it does not need and
    # matches its first run.
    name = "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_multi_dist_optimizer_instances"
    errors = {r["golden_file"]: r["error"] for r in results if r["name"] == name}
    assert -0.03 <= errors["golden_values_dev_dgx_h100_2nd.json"] <= 0.0
    assert 0.12 <= errors["golden_values_dev_dgx_gb200_2nd.json"] <= 0.13
    reruns = [r["error"] for r in results if r["golden_file"].endswith("_2nd.json")
              and r["name"] != name and "zp_z3" not in r["name"]]
    assert len(reruns) == 42 and max(abs(e) for e in reruns) <= 0.045


def test_every_large_underestimate_is_a_named_exception(results):
    under = {(r["name"], r["golden_file"]): r["error"] for r in results if r["error"] < -0.10}
    assert set(under) == UNDERESTIMATED


@pytest.mark.parametrize("feature, p90_bound", [
    ("cp", 0.04), ("mtp", 0.06), ("mla", 0.12), ("offloading", 0.12), ("recompute", 0.12), ("fp8", 0.07),
])
def test_feature_breakdown(results, feature, p90_bound):
    errors = [r["error"] for r in results if feature in r["features"]]
    assert errors, feature
    assert stats(errors)[1] <= p90_bound


def test_each_row_is_checked_against_main_as_of_its_golden_date():
    # scripts/golden-provenance.tsv: the tp_pp_sp_tp_overlap rows were written on 2026-07-02,
    # before 3ab71eeb3e (#5041, 2026-07-08) made --deterministic-mode refuse --tp-comm-overlap.
    calibrate = load_script("calibrate")
    row = {"test_case": "gpt/gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap",
           "golden_file": "golden_values_dev_dgx_h100.json"}
    chosen = calibrate.release_for(row)
    assert (chosen.version, chosen.as_of) == ("main", "2026-07-02")
    unlisted = calibrate.release_for({"test_case": "x", "golden_file": "y"})
    assert (unlisted.version, unlisted.as_of) == ("main", "")


def test_the_record_is_the_shared_measurements():
    # tests/data/megatron-ci-dev.tsv.gz is ../shared/calibration/megatron-ci-dev.tsv byte for byte
    shared = shared_file("calibration", "megatron-ci-dev.tsv")
    assert gzip.decompress(CALIBRATION_TSV.read_bytes()) == shared.read_bytes()
