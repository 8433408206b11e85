"""Child of scripts/megatron_validate: runs Megatron-LM's own parse_args + validate_args on CPU.

Reads JSON lines {"argv": [...], "world_size": N} on stdin, writes {"outcome": "accept"|"refuse",
"error": first line} per case.  Stubs (test-only, documented): megatron/core/transformer/moe/ops/paged_stash.py (imports triton for
GPU kernels; a no-op module); ``get_device_arch_version`` returns 10 (Blackwell); the environment has
no CUDA_DEVICE_MAX_CONNECTIONS except what a case sets.
"""
import io, json, os, sys, types, contextlib

tree = sys.argv[1]
sys.path.insert(0, tree)
# Modules that import triton (GPU kernels only) are stood in by no-op modules: every such
# file under megatron/ whose module does not already exist in sys.modules.


def _noop(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *a, **k: None


for root, _dirs, files in os.walk(os.path.join(tree, "megatron")):
    for fname in files:
        if not fname.endswith(".py"):
            continue
        path = os.path.join(root, fname)
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if "\nimport triton" not in text and "\nfrom triton" not in text:
            continue
        modname = os.path.relpath(path, tree)[:-3].replace(os.sep, ".")
        if modname.endswith(".__init__"):
            continue
        stub = types.ModuleType(modname)
        stub.__file__ = path
        stub.__getattr__ = _noop
        sys.modules[modname] = stub
import typing  # noqa: E402

if not hasattr(typing, "override"):          # Python 3.12 typing.override, used by megatron/training/models
    typing.override = lambda f: f
import megatron.training.arguments as A  # noqa: E402
A.get_device_arch_version = lambda: 10   # Blackwell: the pre-Blackwell CUDA_DEVICE_MAX_CONNECTIONS=1 rule is off, as in the estimator without a GPU named

for line in sys.stdin:
    case = json.loads(line)
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["RANK"] = "0"
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(case.get("env", {}))
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = A.parse_args()
            A.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        result = {"outcome": "accept", "error": ""}
    except SystemExit:
        lines = [l for l in out.getvalue().splitlines() if "error:" in l]
        result = {"outcome": "refuse", "error": (lines[-1] if lines else "argparse exit")[:200]}
    except BaseException as err:  # noqa: BLE001 - any failure is Megatron refusing
        result = {"outcome": "refuse", "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]}
    print(json.dumps(result), flush=True)
