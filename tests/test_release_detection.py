"""The Megatron release from a NeMo container tag (data/nemo_containers.tsv, from
../shared/notes/megatron-versions.md) and from the installed megatron-core's metadata (run only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, SHARED_ENV, shared_records

from megatron_estimator import api
from megatron_estimator.megatron import releases
from megatron_estimator.megatron.releases import installed_megatron_core, nemo_container_release, nemo_tags

ROOT = Path(__file__).resolve().parent.parent
NOTES = SHARED / "notes" / "megatron-versions.md"
RECORDED_LINE = shared_records().get("nemo_containers_line", "")

# The notes' table: 25.09 -> 0.14.0, 25.11 -> 0.15 dev, 26.02 -> 0.16 (main at the time),
# 26.04 -> 0.17.0, 26.06 -> 0.18.0; dev versions map to the nearest release of their minor.
@pytest.mark.parametrize("tag, label, warns", [
    ("25.09", "0.14.0", False), ("25.11", "0.15.3", True), ("26.02", "0.16.1", True),
    ("26.04", "0.17.0", False), ("26.06", "0.18.0", False),
])
def test_nemo_tag_maps_by_the_table(tag, label, warns):
    found = nemo_tags(f"srun --container-image=nvcr.io/nvidia/nemo:{tag} python pretrain_gpt.py\n", "job.sh")
    chosen, note = nemo_container_release(found)
    assert note == ""
    assert (chosen.version, chosen.source) == (label, f"NeMo container nvcr.io/nvidia/nemo:{tag} at job.sh:1")
    assert bool(chosen.warning) == warns


def nemo_containers_line(notes: str) -> str:
    """The notes' "- NGC NeMo containers:" item (two lines, joined)."""
    lines = notes.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith("- NGC NeMo containers:"))
    return lines[index] + " " + lines[index + 1]


def test_the_recorded_notes_line_is_the_shared_notes():
    if not NOTES.is_file():
        pytest.skip(f"{NOTES} is absent (set {SHARED_ENV}); the recorded line was checked")
    assert nemo_containers_line(NOTES.read_text()) == RECORDED_LINE


def test_table_matches_the_notes():
    # the line of ../shared/notes/megatron-versions.md, recorded by scripts/record_megatron_checks
    line = RECORDED_LINE
    for tag, (said, _as_checked) in releases.nemo_containers().items():
        assert f"{tag} -> {said}" in line


def test_sbatch_line_and_variable_count_but_comments_do_not():
    script = ("#!/bin/bash\n#SBATCH --container-image=nvcr.io/nvidia/nemo:26.04\n"
              "# IMAGE=nvcr.io/nvidia/nemo:26.06\nIMAGE=nvcr.io/nvidia/nemo:26.04.01\n")
    assert nemo_tags(script, "s.sh") == [("nvcr.io/nvidia/nemo:26.04", "s.sh:2"),
                                         ("nvcr.io/nvidia/nemo:26.04.01", "s.sh:4")]
    chosen, note = nemo_container_release(nemo_tags(script, "s.sh"))
    assert (chosen.version, chosen.source, note) == ("0.17.0", "NeMo container nvcr.io/nvidia/nemo:26.04 at s.sh:2", "")


def test_unknown_tag_and_disagreeing_tags_are_not_used():
    chosen, note = nemo_container_release([("nvcr.io/nvidia/nemo:25.07", "job.sh:3")])
    assert chosen is None
    assert note.startswith("job.sh:3: nvcr.io/nvidia/nemo:25.07 is a NeMo container whose Megatron-LM release")
    chosen, note = nemo_container_release([("nvcr.io/nvidia/nemo:25.09", "a:1"), ("nvcr.io/nvidia/nemo:26.06", "a:2")])
    assert chosen is None and "different Megatron-LM releases" in note


def _script(tmp_path, tag):
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\nsrun --container-image=nvcr.io/nvidia/nemo:{tag} \\\n  python pretrain_gpt.py\n")
    return str(path)


def test_precedence_explicit_tree_setting_then_container(tmp_path):
    script = _script(tmp_path, "26.04")
    chosen = api.choose_megatron_release(None, {}, launch=["sbatch", script])
    assert (chosen.version, chosen.source) == ("0.17.0", f"NeMo container nvcr.io/nvidia/nemo:26.04 at {script}:2")
    chosen = api.choose_megatron_release(None, {"MEGATRON_ESTIMATOR_MEGATRON_VERSION": "0.16"},
                                         launch=["sbatch", script])
    assert (chosen.version, chosen.source) == ("0.16.1", "MEGATRON_ESTIMATOR_MEGATRON_VERSION")
    chosen = api.choose_megatron_release("0.19", {}, launch=["sbatch", script])
    assert chosen.version == "0.19.0"
    tree = tmp_path / "mlm"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 18\nPATCH = 0\n")
    chosen = api.choose_megatron_release(None, {"PYTHONPATH": str(tree)}, launch=["sbatch", script])
    assert chosen.version == "0.18.0"


def test_container_in_the_launch_command_itself():
    chosen = api.choose_megatron_release(None, {}, launch=[
        "srun", "--container-image=nvcr.io/nvidia/nemo:25.09", "python", "pretrain_gpt.py"])
    assert (chosen.version, chosen.source) == ("0.14.0", "NeMo container nvcr.io/nvidia/nemo:25.09 at the launch command")


def test_unknown_container_tag_falls_to_the_default_with_a_warning(tmp_path):
    script = _script(tmp_path, "25.07")
    chosen = api.choose_megatron_release(None, {}, launch=["sbatch", script])
    assert chosen.version == "main" and chosen.source.startswith("default:")
    assert "nvcr.io/nvidia/nemo:25.07 is a NeMo container whose Megatron-LM release the estimator does not know" \
        in chosen.warning


# -- the installed megatron-core ------------------------------------------------------------------

def _fake_dist(tmp_path, version):
    dist = tmp_path / f"megatron_core-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: megatron-core\nVersion: {version}\n\nbody\n")
    return str(tmp_path)


def test_installed_metadata_read_from_a_dist_info_directory(tmp_path):
    assert installed_megatron_core([_fake_dist(tmp_path, "0.17.1")]) == "0.17.1"
    assert installed_megatron_core([str(tmp_path / "nothing")]) is None


def test_installed_metadata_agrees_with_importlib_metadata(tmp_path, monkeypatch):
    from importlib import metadata

    path = _fake_dist(tmp_path, "0.18.0")
    monkeypatch.setattr(sys, "path", [path] + sys.path)
    assert installed_megatron_core() == metadata.version("megatron-core") == "0.18.0"


def test_installed_metadata_only_when_the_environment_is_the_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [_fake_dist(tmp_path, "0.17.1")] + sys.path)
    chosen = api.choose_megatron_release(None, {}, environment_is_jobs=True)
    assert (chosen.version, chosen.source) == (
        "0.17.1", "the checking environment's megatron-core 0.17.1 (its installed metadata)")
    assert api.choose_megatron_release(None, {}).version == "main"
    assert api.choose_megatron_release(None, {"MEGATRON_ESTIMATOR_MEGATRON_VERSION": "0.16"},
                                       environment_is_jobs=True).version == "0.16.1"


def _cli(*args, path_entry):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_")}
    environ["PYTHONPATH"] = os.pathsep.join([path_entry, str(ROOT)])
    return subprocess.run([sys.executable, "-m", "megatron_estimator", *args], capture_output=True,
                          text=True, env=environ, cwd=ROOT)


SMALL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
         "--max-position-embeddings", "512", "--micro-batch-size", "1", "--vocab-size", "32000", "--bf16"]


def test_run_uses_the_installed_metadata_and_estimate_does_not(tmp_path):
    path = _fake_dist(tmp_path, "0.17.1")
    run = _cli("run", "--budget", "1MiB", "--format", "json", "--", "python", "pretrain_gpt.py", *SMALL,
               path_entry=path)
    assert run.returncode == 1, run.stderr
    assert json.loads(run.stderr)["megatron"] == {
        "version": "0.17.1", "source": "the checking environment's megatron-core 0.17.1 (its installed metadata)"}
    est = _cli("estimate", "--budget", "80GiB", "--format", "json", "--", *SMALL, path_entry=path)
    assert json.loads(est.stdout)["megatron"]["version"] == "main"


def test_check_of_a_launch_script_names_its_container(tmp_path):
    # NullTokenizer LLaMA-3-8B: 26.04 holds 0.17.0, whose NullTokenizer adds an end-of-document
    # token (128256 + 1 rows, padded to 128384): 8,031,309,824 parameters; main: 8,030,261,248.
    flags = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
             "--micro-batch-size 1 --global-batch-size 64 --swiglu --normalization RMSNorm "
             "--untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type rope --bf16 "
             "--tokenizer-type NullTokenizer --vocab-size 128256")
    for tag, params in (("26.04", 8_031_309_824), ("26.06", 8_030_261_248)):
        script = tmp_path / f"job-{tag}.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=8\n"
                          f"#SBATCH --container-image=nvcr.io/nvidia/nemo:{tag}\n"
                          f"srun python pretrain_gpt.py {flags}\n")
        result = _cli("check", str(script), "--budget", "141GiB", "--format", "json", path_entry=str(tmp_path))
        doc = json.loads(result.stdout)
        doc = doc[0] if isinstance(doc, list) else doc
        assert doc["megatron"]["source"] == f"NeMo container nvcr.io/nvidia/nemo:{tag} at {script}:4"
        assert doc["total_parameters"] == params


def test_an_unsupported_installed_megatron_core_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [_fake_dist(tmp_path, "0.12.0")] + sys.path)
    chosen = api.choose_megatron_release(None, {}, environment_is_jobs=True)
    assert chosen.version == "main" and chosen.source.startswith("default:")
    # 0.12 is older than 0.14.0, the first row of data/megatron_releases.tsv
    assert chosen.warning == ("the checking environment's megatron-core is not used: Megatron 0.12.0 is not a "
                              "supported release: it is older than 0.14.0, the oldest the estimator supports "
                              "(supported: " + ", ".join(releases.labels()) + ")")
