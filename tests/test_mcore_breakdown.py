"""The per-module breakdown (model/breakdown.py) against megatron-core 0.16.1's own modules.

Importing megatron-core sets NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN in
``os.environ``, which scripts/calibrate passes on as the job's environment (tests/test_calibration.py
then finds rows invalid): the test puts the environment back, and the file sorts after
test_calibration.py as tests/test_mcore_crosscheck.py does."""

from __future__ import annotations

import os

import pytest

from conftest import estimate



MCORE_CASES = ["gpt tp2 pp2 tied copy", "moe tp2 etp1 ep2 pp2", "moe dense-then-moe shared experts", "mtp last stage",
               "mla tp2 (down projections duplicated)"]


@pytest.mark.parametrize("name", MCORE_CASES)
def test_module_parameters_equal_megatron_cores_modules(name):
    # megatron-core 0.16.1 builds each pipeline rank on the meta device (tests/mcore_reference.py);
    # its parameters grouped by module (embedding, each decoder layer by whether it holds a
    # router, the final norm, the output layer, MTP) are the breakdown's rows.
    mcore_reference = pytest.importorskip("mcore_reference")
    ok, why = mcore_reference.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    from test_mcore_crosscheck import CASES, INSTALLED_RELEASE, spec_for

    text, world = next((t, w) for n, t, w in CASES if n == name)
    theirs: dict = {}
    saved = dict(os.environ)
    try:
        reference = mcore_reference.reference_parameter_counts(spec_for(text))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for stage in reference:
        moe_layers = {t.name.split(".mlp.router.")[0] for t in stage.tensors if ".mlp.router." in t.name}
        for t in stage.tensors:
            if t.name.startswith("decoder.layers."):
                layer = ".".join(t.name.split(".")[:3])
                key = ("layers", "moe" if layer in moe_layers else "dense")
            elif t.name.startswith("decoder.final_layernorm"):
                key = ("final_norm", None)
            else:
                key = ({"embedding": "embedding", "output_layer": "output_layer", "mtp": "mtp"}[t.name.split(".")[0]], None)
            key = (stage.pipeline_rank, stage.virtual_stage or 0) + key
            theirs[key] = theirs.get(key, 0) + t.te_numel
    e = estimate(text, world, release=INSTALLED_RELEASE)
    ours = {(s.pipeline_rank, m.chunk, m.module, m.kind): m.parameters
            for s in e.stages for m in s.modules if m.parameters}
    assert ours == theirs
