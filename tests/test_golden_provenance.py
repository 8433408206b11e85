"""scripts/golden_provenance (when a golden-values file's memory figures were written) and how
scripts/calibrate uses it to name the CI image that measured a row."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess

import pytest

from conftest import REPO, load_script

calibrate = load_script("calibrate")
golden_provenance = load_script("golden_provenance")

TEST_DIR = "tests/functional_tests/test_cases/gpt/toy_test"


def golden(peak: int, allocated: int, iteration_time: float) -> str:
    return json.dumps({
        "mem-max-allocated-bytes": {"start_step": 1, "end_step": 2, "step_interval": 1,
                                    "values": {"1": "nan", "2": peak}},
        "mem-allocated-bytes": {"start_step": 1, "end_step": 2, "step_interval": 1,
                                "values": {"1": allocated, "2": allocated}},
        "iteration-time": {"start_step": 1, "end_step": 2, "step_interval": 1,
                           "values": {"1": "nan", "2": iteration_time}},
    })


@pytest.fixture
def megatron_history(tmp_path):
    """A git repository whose golden-values file is measured twice, then edited once without
    touching its memory series."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "Megatron-LM"
    (repo / TEST_DIR).mkdir(parents=True)
    env = {"GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.com", "GIT_COMMITTER_NAME": "ci",
           "GIT_COMMITTER_EMAIL": "ci@example.com", "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def commit(text: str, date: str) -> str:
        (repo / TEST_DIR / "golden_values_lts_dgx_a100.json").write_text(text)
        dated = dict(env, GIT_AUTHOR_DATE=f"{date}T12:00:00+00:00", GIT_COMMITTER_DATE=f"{date}T12:00:00+00:00")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=dated)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", date], check=True, env=dated)
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=dated,
                              capture_output=True, text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    commit(golden(2_000_000_000, 700_000_000, 1.5), "2025-10-21")
    measured = commit(golden(2_100_000_000, 700_000_000, 1.4), "2025-11-06")
    commit(golden(2_100_000_000, 700_000_000, 1.2), "2026-08-19")      # iteration times only
    return repo, measured


def test_the_measuring_commit_is_the_one_that_wrote_the_memory_series(megatron_history):
    repo, measured = megatron_history
    assert golden_provenance.measured_in(repo, "gpt/toy_test", "golden_values_lts_dgx_a100.json") == \
        (measured, "2025-11-06")
    assert golden_provenance.measured_in(repo, "gpt/toy_test", "golden_values_dev_dgx_h100.json") is None


def test_the_script_writes_one_line_per_golden_file(megatron_history, tmp_path, capsys):
    repo, measured = megatron_history
    tsv = tmp_path / "rows.tsv"
    header = ["test_case", "golden_file", "gpu", "nodes", "gpus_per_node", "world_size",
              "measured_peak_allocated_bytes", "measured_last_step_allocated_bytes", "env_json", "argv_json"]
    with open(tsv, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        for golden_file in ("golden_values_lts_dgx_a100.json", "golden_values_lts_dgx_a100.json",
                            "golden_values_dev_dgx_h100.json"):
            writer.writerow(["gpt/toy_test", golden_file, "a100", 1, 8, 8, 1, 1, "{}", "[]"])
    assert golden_provenance.main(["--megatron", str(repo), str(tsv)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["test_case\tgolden_file\tcommit\tdate",
                                f"gpt/toy_test\tgolden_values_lts_dgx_a100.json\t{measured}\t2025-11-06"]
    assert "1 golden-values files have no history" in err


def test_the_script_refuses_what_is_not_a_checkout(tmp_path, capsys):
    assert golden_provenance.main(["--megatron", str(tmp_path), str(REPO / "README.md")]) == 2
    assert "not a git checkout" in capsys.readouterr().err


def test_the_ci_image_of_a_row(monkeypatch):
    monkeypatch.setattr(calibrate, "PROVENANCE", {
        ("gpt/a", "golden_values_lts_dgx_a100.json"): "2025-10-21",
        ("gpt/b", "golden_values_lts_dgx_a100.json"): "2025-11-06",
        ("gpt/a", "golden_values_dev_dgx_a100.json"): "2025-10-21",
    })
    assert calibrate.stack_of({"test_case": "gpt/a", "golden_file": "golden_values_lts_dgx_a100.json"}) == \
        "lts before #2157"
    assert calibrate.stack_of({"test_case": "gpt/b", "golden_file": "golden_values_lts_dgx_a100.json"}) == "lts"
    assert calibrate.stack_of({"test_case": "gpt/c", "golden_file": "golden_values_lts.json"}) == \
        "lts (date unknown)"
    assert calibrate.stack_of({"test_case": "gpt/a", "golden_file": "golden_values_dev_dgx_a100.json"}) == "dev"
    row = {"test_case": "gpt/a", "golden_file": "golden_values_lts_dgx_a100.json", "gpu": "a100"}
    assert calibrate.overheads_for(row).flash_attn == "none"
    assert calibrate.overheads_for(dict(row, test_case="gpt/b")).flash_attn is None


def test_the_bundled_provenance_covers_every_measured_row(calibration_rows):
    rows = {(r["test_case"], r["golden_file"]) for r in calibration_rows}
    assert rows <= set(calibrate.read_provenance())
    assert len(calibrate.read_provenance()) == 337
