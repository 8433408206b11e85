"""Child of scripts/megatron_validate: runs Megatron-LM's own checks on CPU, stage by stage.

Reads JSON lines {"argv": [...], "world_size": N, "env": {...}, "device_arch": A} on stdin and
writes one JSON line per case: {"outcome": "accept"|"refuse", "stage": S, "error": first line,
"build": how the model build ran}.  Stages, in Megatron's order:

  parse     megatron/training/arguments.py parse_args (argparse)
  validate  megatron/training/arguments.py validate_args
  config    megatron/training/argument_utils.py core_transformer_config_from_args
            (TransformerConfig / MLATransformerConfig __post_init__)
  build     megatron/core/parallel_state.py initialize_model_parallel on the single-process
            ``fake`` torch.distributed backend (what Megatron's --fake-process-group does), then
            pretrain_gpt.py's model provider (gpt_builders.py gpt_builder) on the meta device,
            for every virtual stage of the first and the last pipeline rank
  train     the checks of the first training step that stop a job before it trains
            (MoELayer.forward's sequence-parallel check), evaluated on the built model
  none      (accept) every stage passed

Any exception before the build is Megatron refusing (argparse's SystemExit, the asserts and
ValueErrors of validate_args and __post_init__).  At the build stage, an exception that comes
from the CPU harness itself (no CUDA, no Transformer Engine, no apex) is not Megatron refusing:
the case is recorded as accepted with "build": "not run: ..." and the reason; but an error that
initialize_model_parallel raises itself (RuntimeError, ZeroDivisionError, its asserts: sizes that
do not divide the world) is Megatron refusing.  What a GPU
machine has and this one does not is stood in for, each named in "build": without Transformer
Engine a --transformer-impl transformer_engine case builds the local spec, whose attention is
built with CP 1 (TE's does context parallelism); without apex the torch norm neither persists
nor refuses sequence parallelism where it stands in for apex's FusedLayerNorm or TE's norm, and
keeps every check where it is the module a GPU machine builds (local-spec RMSNorm; see
_norm_stand_in); no gradient-accumulation fusion
kernel; the RNG tracker passes as CUDA-graph capable where validate_args / initialize.py make it
so; the local spec's explicit MLA q/kv norms (which TE's spec fuses) are not a refusal.

Stubs (test-only, documented): modules that import triton (GPU kernels) are no-op modules;
Transformer Engine's version (``get_te_version``) is TE_STAND_IN, so the TE version checks of
validate_args and __post_init__ answer as on a machine with TE, and its fused MoE permutation
kernels are present (stand-ins never called: the build still has no TE);
``get_device_arch_version`` (and ``torch.cuda.get_device_capability``) return the case's
"device_arch" (its CI row's GPU; default 10, Blackwell); the environment is the case's "env"
(its CI row's, then the mutation) over the harness's own without CUDA_DEVICE_MAX_CONNECTIONS
and NVTE_*; ``torch.cuda.current_device`` names the meta device and the CUDA RNG tracker
forks nothing during the build (tests/mcore_reference.py _cpu_only_megatron).
"""
import contextlib, io, json, math, os, sys, traceback, types, warnings

tree = sys.argv[1]
sys.path.insert(0, tree)
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))


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
# older releases' tokenizers import six and regex (GPT-2 / BERT tokenization, never called
# here): no-op modules where they are not installed
for _name in ("six", "regex"):
    try:
        __import__(_name)
    except ImportError:
        _stub = types.ModuleType(_name)
        _stub.__getattr__ = _noop
        sys.modules[_name] = _stub
import typing  # noqa: E402

if not hasattr(typing, "override"):          # Python 3.12 typing.override, used by megatron/training/models
    typing.override = lambda f: f
import torch  # noqa: E402
import megatron.core.utils as U  # noqa: E402
from packaging.version import Version  # noqa: E402

# A GPU machine runs Megatron with Transformer Engine installed; its version checks (validate_args,
# TransformerConfig.__post_init__) are answered as for TE_STAND_IN (the harness has no TE).
TE_STAND_IN = "2.14.0"
_original_te_version = U.get_te_version
U.get_te_version = lambda: Version(TE_STAND_IN)
import megatron.training.arguments as A  # noqa: E402
import megatron.training.global_vars as G  # noqa: E402
try:
    from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402
except ImportError:   # releases before argument_utils.py (core_v0.14.0): in arguments.py
    core_transformer_config_from_args = A.core_transformer_config_from_args

BASE_ENV = {k: v for k, v in os.environ.items()
            if k != "CUDA_DEVICE_MAX_CONNECTIONS" and not k.startswith("NVTE_")}
# ... and its fused MoE permutation kernels exist (TransformerConfig.__post_init__ asks for them
# with --moe-permute-fusion; the meta-device build never calls them)
from megatron.core.extensions import transformer_engine as _te_ext  # noqa: E402


def _te_kernel_stand_in(*args, **kwargs):
    raise RuntimeError("a Transformer Engine kernel stand-in was called (no TE on this machine)")


from megatron.core.transformer.moe import moe_utils as _moe_utils  # noqa: E402  (binds them by name)

for _name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
              "fused_sort_chunks_by_index_with_probs", "fused_unpermute", "fused_permute_and_pad_with_probs"):
    for _holder in (_te_ext, _moe_utils):
        if getattr(_holder, _name, "absent") is None:
            setattr(_holder, _name, _te_kernel_stand_in)
for _module in list(sys.modules.values()):     # the modules that imported it by name
    if getattr(_module, "get_te_version", None) is _original_te_version:
        _module.get_te_version = U.get_te_version
DEVICE_ARCH = [10]
A.get_device_arch_version = lambda: DEVICE_ARCH[0]
# validate_args asks the GPU's compute capability (--moe-grouped-gemm): the case's GPU's
torch.cuda.get_device_capability = lambda *a, **k: (DEVICE_ARCH[0], 0)

# Exceptions by which Megatron refuses on purpose (asserts, value checks, argparse exits).
REFUSALS = (SystemExit, AssertionError, ValueError, NotImplementedError)
# What the CPU harness cannot run at the build stage (recorded, not a refusal).
HARNESS_LIMITS = ("CUDA", "cuda", "transformer_engine", "Transformer Engine", "TransformerEngine",
                  "apex", "triton", "NCCL", "nccl", "MagicMock", "HAVE_TE")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:240]


def _where(err: BaseException) -> str:
    """The innermost Megatron frame of ``err``: path:line (relative to the tree)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(tree)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.relpath(f.filename, tree)}:{f.lineno}"


def _padded_vocab(args) -> int:
    # --padded-vocab-size is used as given (megatron/core/tokenizers/utils/build_tokenizer.py
    # _set_padded_vocab_size pads only when it is None; d98e8a64 lines 149-152)
    if args.padded_vocab_size is not None:
        return args.padded_vocab_size
    size = args.vocab_size or 50257
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return int(math.ceil(size / multiple) * multiple)


@contextlib.contextmanager
def _parallel_state(args, world: int, pipeline_rank: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron.core import parallel_state as ps

    per_stage = world // args.pipeline_model_parallel_size
    dist.init_process_group("fake", store=FakeStore(), rank=pipeline_rank * per_stage, world_size=world)
    try:
        ps.initialize_model_parallel(
            args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.virtual_pipeline_model_parallel_size,
            context_parallel_size=args.context_parallel_size,
            hierarchical_context_parallel_sizes=args.hierarchical_context_parallel_sizes,
            expert_model_parallel_size=args.expert_model_parallel_size,
            num_distributed_optimizer_instances=args.num_distributed_optimizer_instances,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
            order='tp-cp-ep-dp-pp' if not args.use_tp_pp_dp_mapping else 'tp-cp-ep-pp-dp',
            create_gloo_process_groups=False)
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


@contextlib.contextmanager
def _local_attention_takes_cp():
    """TE's attention does context parallelism; the local spec's DotProductAttention asserts CP 1
    (megatron/core/transformer/dot_product_attention.py).  Standing in for TE, it is built with
    CP 1 (CP changes no parameter shape)."""
    import copy
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    original = DotProductAttention.__init__

    def init(self, config, *a, **k):
        if config.context_parallel_size > 1:
            config = copy.copy(config)
            config.context_parallel_size = 1
        original(self, config, *a, **k)

    DotProductAttention.__init__ = init
    try:
        yield
    finally:
        DotProductAttention.__init__ = original


def _build(args, config, world: int) -> str:
    """Builds every virtual stage of the first and last pipeline rank; returns how it ran: the
    spec, then what the CPU harness stood in for (each a kernel library's feature, not a check)."""
    import mcore_reference as ref
    try:
        from gpt_builders import gpt_builder
    except ImportError as err:   # releases before gpt_builders.py (core_v0.14.0): not built here
        raise HarnessLimit("no gpt_builders.py in this release's tree (validate and config only)") from err

    how = [f"{args.transformer_impl} spec"]
    stand_in_for_te = False
    if args.transformer_impl == "transformer_engine":
        from megatron.core.extensions import transformer_engine as te_ext
        if not getattr(te_ext, "HAVE_TE", False):
            args.transformer_impl = "local"
            config.transformer_impl = "local"
            stand_in_for_te = True
            how = ["local spec (Transformer Engine not installed)"]
            if config.context_parallel_size > 1:
                how.append("local attention built with CP 1 (TE's does CP)")
    if not _have("apex") and (stand_in_for_te or config.normalization == "LayerNorm"):
        how.append("the torch norm stands in for "
                   + ("TE's norm" if stand_in_for_te else "apex's FusedLayerNorm") + ", keeping its checks")
    if config.gradient_accumulation_fusion:
        # the fused weight-gradient kernel (apex / TE) is checked for at build time
        config.gradient_accumulation_fusion = False
        args.gradient_accumulation_fusion = False
        how.append("no gradient-accumulation fusion kernel on CPU")
    if args.te_rng_tracker or args.cuda_graph_impl != "none":
        how.append("a CUDA-graph-capable RNG tracker stood in for")
    args.padded_vocab_size = _padded_vocab(args)
    # Shapes and checks only: nothing is initialised, every tensor stays on the meta device
    # (megatron-core names torch.cuda.current_device() explicitly where it allocates).
    config.perform_initialization = False
    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size
    chunks = vpp if (pp > 1 and vpp is not None) else None
    for rank in sorted({0, pp - 1}):
        with _parallel_state(args, world, rank), ref._cpu_only_megatron(), \
                _norm_stand_in(config, stand_in_for_te), torch.device("meta"), \
                (_local_attention_takes_cp() if stand_in_for_te else contextlib.nullcontext()):
            torch.cuda.current_device = lambda: "meta"
            from megatron.core.tensor_parallel import random as mrandom
            # --te-rng-tracker (validate_args turns it on for CUDA graphs with TE) or, for local
            # CUDA graphs, the cudagraphable Megatron tracker (megatron/training/initialize.py):
            # both pass megatron/core/transformer/cuda_graphs.py's check; so does the CPU stand-in
            mrandom._CUDA_RNG_STATE_TRACKER.is_inference_rng_tracker = bool(
                args.te_rng_tracker or args.cuda_graph_impl != "none")
            for vp in (range(chunks) if chunks else [None]):
                pre = rank == 0 and (vp is None or vp == 0)
                post = rank == pp - 1 and (vp is None or vp == chunks - 1)
                try:
                    if args.multi_latent_attention:
                        model = _build_mla(ref, gpt_builder, args, config, pre, post, vp)
                    else:
                        model = gpt_builder(args, pre, post, vp, config=config)
                except REFUSALS as err:
                    # the local spec's explicit MLA q/kv norms, which TE's spec fuses into its
                    # linear layers (megatron/core/transformer/mla_qk_norm_config.py)
                    # and the experimental attention variants' decoder spec, which asserts TE
                    # (megatron/core/models/gpt/experimental_attention_variant_module_specs.py,
                    # d98e8a64 line 498): a GPU machine with TE builds it
                    if stand_in_for_te and "experimental_attention_variant_module_specs.py" in _where(err):
                        raise HarnessLimit(f"{_first_line(err)} (the local spec standing in for TE)") from err
                    if stand_in_for_te and "mla_qk_norm_config.py" in _where(err):
                        raise HarnessLimit(f"{_first_line(err)} (the local spec standing in for TE)") from err
                    raise
                _first_step_checks(model)
    return "; ".join(how)


@contextlib.contextmanager
def _norm_stand_in(config, stand_in_for_te: bool):
    """Without apex and TE the local spec builds megatron/core/transformer/torch_norm.py
    WrappedTorchNorm for every norm.  On a GPU machine that is the module only for a local-spec
    RMSNorm (megatron/core/models/backends.py LocalSpecProvider.layer_norm): there it keeps all
    of its asserts (zero-centred gamma, persistent norm, sequence parallelism, memory-efficient
    norm).  Where it stands in for apex's FusedLayerNorm (local spec, LayerNorm) it keeps
    FusedLayerNorm's check instead (megatron/core/fusions/fused_layer_norm.py: LayerNorm only;
    persistence falls back to the plain kernel; SP and zero-centred gamma are supported); where it
    stands in for TE's norm (TE spec) TE supports all four.  Nothing else is relaxed."""
    if not (stand_in_for_te or config.normalization == "LayerNorm"):
        yield
        return
    import copy
    from megatron.core.transformer import torch_norm

    original = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, hidden_size, eps=1e-5, **kwargs):
        if not stand_in_for_te:
            assert config.normalization == "LayerNorm", \
                f"({config.normalization}) is not supported in FusedLayerNorm"  # fused_layer_norm.py
        relaxed = copy.copy(config)
        relaxed.sequence_parallel = relaxed.persist_layer_norm = False
        relaxed.layernorm_zero_centered_gamma = relaxed.memory_efficient_layer_norm = False
        norm = original(cls, relaxed, hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new
    try:
        yield
    finally:
        torch_norm.WrappedTorchNorm.__new__ = original


class HarnessLimit(Exception):
    """What the CPU harness cannot build as a GPU machine would: not Megatron refusing."""


class TrainingTimeRefusal(Exception):
    """A check Megatron makes in the first training step, evaluated on the built model."""


def _first_step_checks(model) -> None:
    """Checks of the first forward pass that stop a job before its first step, evaluated on
    the built modules with the condition Megatron's forward tests (not run: no forward pass on
    the meta device).  megatron/core/transformer/moe/moe_layer.py MoELayer.forward: in
    training, an attention TP group above 1 without sequence parallelism raises ValueError."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for module in model.modules():
        if isinstance(module, MoELayer) and module.training and module.attn_tp_group.size() > 1 \
                and not module.config.sequence_parallel:
            raise TrainingTimeRefusal(
                "ValueError: MoE with tensor parallelism needs sequence parallelism in training "
                "(megatron/core/transformer/moe/moe_layer.py MoELayer.forward, first step)")


def _build_mla(ref, gpt_builder, args, config, pre, post, vp):
    """The local spec's MLA passes k/v channels its core attention does not take
    (tests/mcore_reference.py _mla_core_attention_class): swap it before building."""
    import gpt_builders
    from megatron.core.models.gpt import GPTModel

    replacement = ref._mla_core_attention_class()
    original = gpt_builders.GPTModel

    def patched(*a, **k):
        ref._patch_mla_core_attention(k.get("transformer_layer_spec"), replacement)
        ref._patch_mla_core_attention(k.get("mtp_block_spec"), replacement)
        return GPTModel(*a, **k)

    gpt_builders.GPTModel = patched
    try:
        return gpt_builder(args, pre, post, vp, config=config)
    finally:
        gpt_builders.GPTModel = original


def _training_configs(args) -> None:
    """The DDP and optimizer configs (their __post_init__ checks) as megatron/training/training.py
    builds them from the arguments (get_megatron_ddp_config / get_megatron_optimizer_config, where
    the release has them; older releases build them inline in get_model / setup_model_and_optimizer)."""
    import dataclasses
    try:
        import megatron.training.training as T
    except Exception:  # noqa: BLE001 - a release whose training module needs what CPU lacks
        return
    if hasattr(T, "get_megatron_ddp_config"):
        T.get_megatron_ddp_config(args)
    else:
        from megatron.core.distributed import DistributedDataParallelConfig as D
        D(**{f.name: getattr(args, f.name) for f in dataclasses.fields(D) if hasattr(args, f.name)})
    if hasattr(T, "get_megatron_optimizer_config"):
        T.get_megatron_optimizer_config(args)
    else:
        from megatron.core.optimizer import OptimizerConfig as O
        O(**{f.name: getattr(args, f.name) for f in dataclasses.fields(O) if hasattr(args, f.name)})


# Coverage of Megatron's raise sites (scripts/megatron_coverage): HARNESS_SITES names a JSON file
# {tree-relative path: [line, ...]}; a case reports which of those lines ran ("hits").
_SITES = {}
if os.environ.get("HARNESS_SITES"):
    with open(os.environ["HARNESS_SITES"], encoding="utf-8") as fh:
        _SITES = {os.path.join(tree, k): set(v) for k, v in json.load(fh).items()}
_HITS = set()


def _tracer(frame, event, arg):
    lines = _SITES.get(frame.f_code.co_filename)
    if lines is None:
        return None

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno in lines:
            _HITS.add(f"{os.path.relpath(frame.f_code.co_filename, tree)}:{frame.f_lineno}")
        return local
    return local


class CaseTimeout(BaseException):
    """The per-case time limit (HARNESS_CASE_SECONDS) ran out."""


def _alarm(signum, frame):
    raise CaseTimeout()


def _parser_flags() -> list:
    """Every option of Megatron's parser: [option, kind, choices, nargs] (kind: switch, int,
    float, str)."""
    import argparse
    parser = A.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    out = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or longs[0] == "--help":
            continue
        if action.nargs == 0:
            kind = "switch"
        else:
            kind = {int: "int", float: "float"}.get(action.type, "str")
        choices = [c for c in action.choices] if action.choices is not None else None
        if choices is not None and not all(isinstance(c, (str, int, float)) for c in choices):
            choices = [str(c) for c in choices]
        out.append([longs[0], kind, choices, action.nargs if isinstance(action.nargs, (int, str)) else None])
    return out


def run_case(case: dict) -> dict:
    import signal
    if case.get("flags"):
        return {"flags": _parser_flags()}
    _HITS.clear()
    seconds = int(os.environ.get("HARNESS_CASE_SECONDS", "0"))
    if seconds:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(seconds)
    if _SITES:
        sys.settrace(_tracer)
    try:
        result = _run_case(case)
    except CaseTimeout:
        result = {"outcome": "timeout", "stage": "timeout", "error": f"over {seconds} s"}
    finally:
        sys.settrace(None)
        if seconds:
            signal.alarm(0)
    if _SITES:
        result["hits"] = sorted(_HITS)
    return result


def _run_case(case: dict) -> dict:
    os.environ.clear()                       # what an earlier case (or its build: NVTE_*) set goes
    os.environ.update(BASE_ENV)
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["RANK"] = "0"
    os.environ.update(case.get("env", {}))
    DEVICE_ARCH[0] = case.get("device_arch", 10)
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    G._GLOBAL_ARGS = None
    out = io.StringIO()
    stage = "parse"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = A.parse_args()
            stage = "validate"
            A.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            G._GLOBAL_ARGS = args
            stage = "config"
            config = core_transformer_config_from_args(args)
            _training_configs(args)
            stage = "build"
            try:
                how = _build(args, config, case["world_size"])
            except HarnessLimit as err:
                return {"outcome": "accept", "stage": "none", "error": "", "build": f"not run: {err}"}
            except TrainingTimeRefusal as err:
                return {"outcome": "refuse", "stage": "train", "error": str(err),
                        "build": "derived: the first training step's check on the built model"}
            except REFUSALS as err:
                if any(word in str(err) for word in HARNESS_LIMITS):
                    return {"outcome": "accept", "stage": "none", "error": "",
                            "build": f"not run: {_first_line(err)}"}
                raise
            except Exception as err:  # noqa: BLE001 - the CPU harness could not build
                if _where(err).startswith("megatron/core/parallel_state.py:") and \
                        isinstance(err, (RuntimeError, ZeroDivisionError, AssertionError)):
                    # initialize_model_parallel's own arithmetic (RuntimeError for a world size
                    # that etp x ep x pp does not divide, ZeroDivisionError for a size 0): the
                    # job stops there on every GPU machine too
                    return {"outcome": "refuse", "stage": "build", "where": _where(err),
                            "error": f"{_first_line(err)} ({_where(err)})"}
                return {"outcome": "accept", "stage": "none", "error": "",
                        "build": f"not run: {_first_line(err)} at {_where(err)}"}
        return {"outcome": "accept", "stage": "none", "error": "", "build": how}
    except SystemExit:
        lines = [l for l in out.getvalue().splitlines() if "error:" in l]
        return {"outcome": "refuse", "stage": stage, "error": (lines[-1] if lines else "argparse exit")[:240]}
    except CaseTimeout:
        raise
    except BaseException as err:  # noqa: BLE001 - any failure before the build is Megatron refusing
        where = _where(err)
        return {"outcome": "refuse", "stage": stage, "where": where,
                "error": _first_line(err) + (f" ({where})" if where else "")}


for line in sys.stdin:
    print(json.dumps(run_case(json.loads(line))), flush=True)
