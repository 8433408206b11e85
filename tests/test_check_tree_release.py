"""`check script.sh`: the release of the Megatron-LM tree holding the pretrain_*.py the script
launches (its megatron/core/package_info.py, read as text), found after expansion, relative to
the directory the script's cd leaves, or absolute.  A fake tree in tmp_path; which flags each
release has comes from data/megatron_flag_history.tsv (--use-legacy-models: removed in 0.18.0,
39ec5ebeb4; --no-pad-vocab-size: added in 0.18.0)."""

from __future__ import annotations

import json

import pytest

from test_cli import run, validate_report

MODEL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
         "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--tokenizer-type NullTokenizer --vocab-size 1000")


def tree(tmp_path, minor, patch=0, name="Megatron-LM"):
    root = tmp_path / "work" / name
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "core" / "package_info.py").write_text(
        f"MAJOR = 0\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = ''\n")
    (root / "pretrain_gpt.py").write_text("")
    return root


def script(tmp_path, body):
    path = tmp_path / "launch.sh"
    path.write_text("#!/bin/bash\n" + body)
    return path


def check_json(*args):
    result = run(["check", "--format", "json", "--budget", "80GiB", *map(str, args)])
    doc = json.loads(result.stdout)
    validate_report(doc)
    return result, doc["results"] if "results" in doc else [doc]


def test_relative_to_the_scripts_cd(tmp_path):
    root = tree(tmp_path, 16, 1)
    path = script(tmp_path, f'TOP={tmp_path}/work\ncd "$TOP/Megatron-LM"\n'
                            f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} --use-legacy-models\n")
    result, [verdict] = check_json(path)
    assert result.returncode == 0, result.stdout
    assert verdict["megatron"] == {
        "version": "0.16.1",
        "source": f"{root}/megatron/core/package_info.py (the Megatron-LM tree of pretrain_gpt.py at {path}:4)"}
    # The same launch checked against main refuses the flag 0.18.0 removed.
    result = run(["check", "--megatron-version", "main", "--budget", "80GiB", str(path)])
    assert result.returncode == 2
    assert "--use-legacy-models: unknown flag (not in Megatron main; removed in 0.18.0" in result.stdout


def test_an_absolute_path_after_expansion(tmp_path):
    root = tree(tmp_path, 18)
    path = script(tmp_path, f'MEGATRON_PATH={root}\n'
                            f'torchrun --nproc-per-node 8 "$MEGATRON_PATH/pretrain_gpt.py" {MODEL} --no-pad-vocab-size\n')
    result, [verdict] = check_json(path)
    assert result.returncode == 0, result.stdout
    assert verdict["megatron"]["version"] == "0.18.0"
    assert verdict["megatron"]["source"].startswith(f"{root}/megatron/core/package_info.py")
    # 0.18.0's NullTokenizer: --vocab-size exactly (1000), not padded (--no-pad-vocab-size)
    assert verdict["total_parameters"] == _gpt_params(1000)


def _gpt_params(vocab):
    # 2 layers of hidden 256, ffn 1024, biases, 2 layernorms each; tied embedding; final norm;
    # learned absolute positions (512 x 256)
    h, f = 256, 1024
    layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    return 2 * layer + vocab * h + 512 * h + 2 * h


def test_each_file_its_own_tree(tmp_path):
    old = tree(tmp_path / "a", 14)
    new = tree(tmp_path / "b", 19)
    first = tmp_path / "first.sh"
    first.write_text(f"#!/bin/bash\ncd {old}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    second = tmp_path / "second.sh"
    second.write_text(f"#!/bin/bash\ncd {new}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    result, verdicts = check_json(first, second)
    assert [v["megatron"]["version"] for v in verdicts] == ["0.14.0", "0.19.0"]
    # 0.14.0's NullTokenizer adds the end-of-document token: 1001, padded to 1024; 0.19.0: 1000 -> 1024
    assert [v["total_parameters"] for v in verdicts] == [_gpt_params(1024), _gpt_params(1024)]


def test_an_unknown_cd_finds_no_tree_and_the_given_version_wins(tmp_path):
    tree(tmp_path, 16, 1)
    path = script(tmp_path, f"cd $SOMEWHERE_UNSET\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    result, [verdict] = check_json(path)
    assert verdict["megatron"]["version"] == "main"
    root = tree(tmp_path / "c", 16, 1)
    path = script(tmp_path, f"cd {root}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    result = run(["check", "--format", "json", "--megatron-version", "0.19", "--budget", "80GiB", str(path)])
    assert json.loads(result.stdout)["megatron"] == {"version": "0.19.0", "source": "--megatron-version"}


@pytest.mark.parametrize("minor, version, warning", [
    (15, "0.15.3", "Megatron 0.15.0 is not a release the estimator knows; checked as 0.15.3"),
    (17, "0.17.0", None),
])
def test_unknown_patches_warn_with_the_file(tmp_path, minor, version, warning):
    root = tree(tmp_path, minor, 0)
    path = script(tmp_path, f"cd {root}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    result, [verdict] = check_json(path)
    assert verdict["megatron"]["version"] == version
    assert verdict["megatron"].get("warning") == warning
    assert (f"megatron-estimator: warning: {path}: {warning}" in result.stderr) == (warning is not None)


def test_a_main_branch_tree_names_the_next_release_and_is_checked_as_main(tmp_path):
    # Megatron-LM main's package_info.py states the release it is heading for (0.20.0 at
    # d98e8a64, newer than every release): that tree is main, said with a warning.
    root = tree(tmp_path, 20)
    path = script(tmp_path, f"torchrun --nproc-per-node 8 {root}/pretrain_gpt.py {MODEL} --no-pad-vocab-size\n")
    result, [verdict] = check_json(path)
    assert result.returncode == 0, result.stdout
    assert verdict["megatron"]["version"] == "main"
    assert "Megatron 0.20.0 is newer than 0.19.0" in result.stderr and "checked as main" in result.stderr
    # Asked for by name, 0.20.0 is no release: exit 2 naming the supported ones.
    result = run(["check", "--megatron-version", "0.20.0", "--budget", "80GiB", str(path)])
    assert result.returncode == 2 and "0.20.0 is not a supported release" in result.stdout + result.stderr


def test_a_tree_of_a_release_too_old_is_one_located_refusal(tmp_path):
    root = tree(tmp_path, 12)
    path = script(tmp_path, f"torchrun --nproc-per-node 8 {root}/pretrain_gpt.py {MODEL}\n")
    result = run(["check", "--budget", "80GiB", str(path)])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    # 0.12 < 0.14.0, the oldest release of data/megatron_releases.tsv: one problem naming the
    # tree's package_info.py, its release and the supported ones
    assert (f"error: {path}:2: {root}/megatron/core/package_info.py (the Megatron-LM tree of {root}/pretrain_gpt.py at "
            f"{path}:2) says: Megatron 0.12.0 is not a supported release: it is older than 0.14.0, the oldest the "
            "estimator supports (supported: 0.14.0") in result.stdout
    assert result.stdout.count("[unsupported-release]") == 1 and "error:" not in result.stdout.split("[unsupported-release]")[1]
