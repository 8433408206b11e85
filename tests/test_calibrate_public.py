"""scripts/calibrate's second input format: public measured runs (the form of
../shared/calibration/realworld-dev.json), compared through the same record as the CI rows
and as ``compare`` (results/comparison.py ``RankComparison``)."""

from __future__ import annotations

import json

from megatron_estimator.api import evaluate, input_from_flags
from megatron_estimator.megatron.gpus import lookup_gpu
from megatron_estimator.model.overhead import Overheads

from conftest import TINY_GPT, flags, load_script

# A made-up run in the file's form: 2 GPUs, pipeline 2, printed by rank 1 (the last stage)
# after 10 iterations; 100 MiB max allocated, 120 MiB max reserved.
CASE = {"id": "made-up-tiny-pp2", "framework": "Megatron-LM pretrain_gpt.py",
        "argv": flags(TINY_GPT, "--pipeline-model-parallel-size 2 --global-batch-size 4"),
        "world_size": 2, "gpu": {"model": "NVIDIA H100 80GB HBM3 (SXM)"}, "printed_by_rank": "rank 1",
        "measured_at": "after 10 iterations",
        "measurement": {"max_allocated_mb": 100.0, "max_reserved_mb": 120.0}}


def test_a_public_run_is_compared_on_its_ranks_stage(tmp_path):
    calibrate = load_script("calibrate")
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"description": "test", "cases": [CASE]}))
    (m,) = calibrate.read_public(path)
    assert (m.rank, m.iteration, m.gpu) == (1, 10, "h100-sxm-80gb")
    assert (m.allocated, m.reserved) == (100 * 2**20, 120 * 2**20)
    c = calibrate.compare(m, calibrate.estimate_measured(m))
    # Independently: the same flags through the API on an H100, stage 1 of 2 (rank 1 of 2 with
    # tp = cp = 1 is the second pipeline stage); after 10 iterations the moments exist, so the
    # steady peak is the one compared.
    inp, problems = input_from_flags(CASE["argv"], environ={}, source="t")
    gpu = lookup_gpu("h100")
    verdict = evaluate(inp, world_size=2, environ={}, problems=problems,
                       overheads=Overheads(compute_capability=gpu.compute_capability_value, gpu_known=True,
                                           resume="no"))
    stage = verdict.estimate.stages[1]
    assert c.pipeline_rank == 1 and c.allocated_peak_bytes == stage.allocated_peak_bytes
    assert c.allocated_error == (stage.allocated_peak_bytes - 100 * 2**20) / (100 * 2**20)
    frag = int(stage.allocated_peak_bytes * 0.05)          # the default fragmentation assumption
    assert c.reserved_error == (stage.allocated_peak_bytes + frag - 120 * 2**20) / (120 * 2**20)


def test_a_run_without_reserved_or_known_gpu(tmp_path):
    calibrate = load_script("calibrate")
    case = dict(CASE, gpu={"model": "not stated"}, measured_at=None,
                measurement={"max_allocated_mb": 100.0, "max_reserved_mb": None})
    m = calibrate.from_public_case(case)
    assert (m.gpu, m.reserved, m.iteration) == ("unknown", None, None)
    assert calibrate.compare(m, calibrate.estimate_measured(m)).reserved_error is None
