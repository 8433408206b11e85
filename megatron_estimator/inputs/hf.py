"""Read a HuggingFace ``config.json`` into the Megatron flags that rebuild the same model.

``load_hf_config(path)`` reads a local file (or the ``config.json`` inside a directory; never
the network) and returns an ``HfImport``: the Megatron settings as a ``RawArgs`` (dest -> value,
located at ``config.json:LINE key``), the same settings as command-line tokens, the mapping
``(hf_key, flag, value)`` that says which key supplied which flag, the problems that stop the
import, and notes for what is approximated or assumed.  Nothing here raises on bad input.

The mapping reproduces the model as megatron-core builds it (``GPTModel`` with the layer specs
in ``megatron/core/models/gpt/gpt_layer_specs.py``), so that parameter counts match the
published sizes.  Conventions follow Megatron-LM's own launch scripts (``examples/mixtral``,
``examples/llama``) and the flags in ``megatron/training/arguments.py``:

- ``vocab_size`` -> ``--vocab-size``; Megatron pads it to a multiple of
  ``--make-vocab-size-divisible-by`` x TP (``megatron/training/models/gpt.py``).
- ``tie_word_embeddings`` false -> ``--untie-embeddings-and-output-weights``.
- SiLU-gated MLP (``hidden_act`` silu) -> ``--swiglu``; RMSNorm -> ``--normalization RMSNorm``
  with ``rms_norm_eps`` -> ``--norm-epsilon``.
- Bias-free linears -> ``--disable-bias-linear``; Qwen2's q/k/v biases -> ``--add-qkv-bias``.
- ``num_key_value_heads`` < heads -> ``--group-query-attention --num-query-groups``.
- MLA (DeepSeek-V2/V3) -> ``--multi-latent-attention`` with ``--q-lora-rank``,
  ``--kv-lora-rank``, ``--qk-head-dim`` (qk_nope_head_dim), ``--qk-pos-emb-head-dim``
  (qk_rope_head_dim), ``--v-head-dim`` and ``--qk-layernorm`` (the q/kv low-rank norms:
  ``megatron/core/transformer/multi_latent_attention.py``).
- Dense/MoE layer patterns -> ``--moe-layer-freq`` in Megatron's list syntax
  (``moe_freq_type`` in ``megatron/training/arguments.py``), e.g. ``([0]*3+[1]*58)``.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_v2",
    "deepseek_v3",
    "gpt2",
    "gpt_neox",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
)

# Megatron flag -> (argument dest, how the flag is given).  "value": takes a value;
# "switch": store_true (dest becomes True); "off": store_false (dest becomes False).
# Dests and actions as in megatron/training/arguments.py (and the dataclass-generated flags).
_FLAGS: dict[str, tuple[str, str]] = {
    "--num-layers": ("num_layers", "value"),
    "--hidden-size": ("hidden_size", "value"),
    "--ffn-hidden-size": ("ffn_hidden_size", "value"),
    "--num-attention-heads": ("num_attention_heads", "value"),
    "--group-query-attention": ("group_query_attention", "switch"),
    "--num-query-groups": ("num_query_groups", "value"),
    "--kv-channels": ("kv_channels", "value"),
    "--max-position-embeddings": ("max_position_embeddings", "value"),
    "--vocab-size": ("vocab_size", "value"),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", "switch"),
    "--normalization": ("normalization", "value"),
    "--norm-epsilon": ("layernorm_epsilon", "value"),
    "--swiglu": ("swiglu", "switch"),
    "--disable-bias-linear": ("add_bias_linear", "off"),
    "--add-qkv-bias": ("add_qkv_bias", "switch"),
    "--qk-layernorm": ("qk_layernorm", "switch"),
    "--attention-dropout": ("attention_dropout", "value"),
    "--hidden-dropout": ("hidden_dropout", "value"),
    "--position-embedding-type": ("position_embedding_type", "value"),
    "--rotary-base": ("rotary_base", "value"),
    "--rotary-percent": ("rotary_percent", "value"),
    "--use-rope-scaling": ("use_rope_scaling", "switch"),
    "--rope-scaling-factor": ("rope_scaling_factor", "value"),
    "--rotary-seq-len-interpolation-factor": ("rotary_seq_len_interpolation_factor", "value"),
    "--window-size": ("window_size", "value"),
    "--num-experts": ("num_experts", "value"),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", "value"),
    "--moe-router-topk": ("moe_router_topk", "value"),
    "--moe-layer-freq": ("moe_layer_freq", "value"),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", "value"),
    "--moe-shared-expert-gate": ("moe_shared_expert_gate", "switch"),
    "--moe-router-pre-softmax": ("moe_router_pre_softmax", "switch"),
    "--moe-router-score-function": ("moe_router_score_function", "value"),
    "--moe-router-enable-expert-bias": ("moe_router_enable_expert_bias", "switch"),
    "--moe-router-num-groups": ("moe_router_num_groups", "value"),
    "--moe-router-group-topk": ("moe_router_group_topk", "value"),
    "--moe-router-topk-scaling-factor": ("moe_router_topk_scaling_factor", "value"),
    "--multi-latent-attention": ("multi_latent_attention", "switch"),
    "--q-lora-rank": ("q_lora_rank", "value"),
    "--kv-lora-rank": ("kv_lora_rank", "value"),
    "--qk-head-dim": ("qk_head_dim", "value"),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", "value"),
    "--v-head-dim": ("v_head_dim", "value"),
    "--rope-type": ("rope_type", "value"),
    "--no-rope-fusion": ("apply_rope_fusion", "off"),
    "--rotary-scaling-factor": ("rotary_scaling_factor", "value"),
    "--mscale": ("mscale", "value"),
    "--mscale-all-dim": ("mscale_all_dim", "value"),
    "--mtp-num-layers": ("mtp_num_layers", "value"),
}

# Keys every HuggingFace config may carry that say nothing about the architecture's shape:
# identity, tokenizer ids, dtype of the stored checkpoint, inference and fine-tuning heads.
_METADATA_KEYS = frozenset(
    {
        "_name_or_path", "architectures", "auto_map", "transformers_version", "model_type",
        "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
        "sep_token_id", "decoder_start_token_id", "use_cache", "initializer_range",
        "output_attentions", "output_hidden_states", "return_dict", "use_return_dict",
        "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
        "task_specific_params", "tokenizer_class", "prefix", "is_decoder",
        "is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder",
        "pruned_heads", "chunk_size_feed_forward", "torchscript", "use_bfloat16",
        "_attn_implementation", "attn_implementation", "classifier_dropout",
        "generation_config", "max_length", "min_length",
    }
)

# Training-loss knobs and runtime switches found in MoE configs; they do not shape the model.
_MOE_TRAINING_KEYS = frozenset(
    {"output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "ep_size"}
)


class MappedFlag(NamedTuple):
    """One Megatron flag the import supplies, and the config.json key it comes from.

    ``value`` is the flag's value as Megatron parses it, or True for a switch.  ``hf_key`` is
    the key read (``model_type`` for what the architecture implies; ``a+b`` when two keys
    decide one flag).
    """

    hf_key: str
    flag: str
    value: Any

    def describe(self) -> str:
        """``--num-layers 32 (num_hidden_layers)``."""
        text = self.flag if self.value is True else f"{self.flag} {_flag_text(self.value)}"
        return f"{text} ({self.hf_key})"


@dataclass(frozen=True)
class HfNote:
    """Something the user should know that does not stop the import: an approximation, an
    assumed default, a key the importer does not read."""

    code: str
    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def to_json(self) -> dict:
        return {"code": self.code, "location": self.location, "message": self.message}


@dataclass(frozen=True)
class HfImport:
    """What one config.json means as Megatron input.

    ``raw`` holds Megatron argument dests with the values argparse would produce (ints, floats,
    a ``(left, right)`` tuple for ``window_size``, a 0/1 list for ``moe_layer_freq``), each
    located at ``config.json:LINE key``.  ``flags`` are the same settings as command-line
    tokens.  When ``problems`` is not empty, ``raw``, ``flags`` and ``mapping`` are empty.
    """

    source: str
    model_type: str | None
    raw: RawArgs
    flags: tuple[str, ...]
    mapping: tuple[MappedFlag, ...]
    problems: tuple[Problem, ...]
    notes: tuple[HfNote, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def command_line(self) -> str:
        """The flags as one shell-safe line."""
        import shlex

        return " ".join(shlex.quote(token) for token in self.flags)


def load_hf_config(path: str | os.PathLike) -> HfImport:
    """Read a local config.json (or the one inside a directory) into Megatron settings."""
    given = os.fspath(path)
    file = os.path.join(given, "config.json") if os.path.isdir(given) else given
    if not os.path.exists(file):
        if os.path.isdir(given):
            message = f"no config.json in directory {given}"
        else:
            message = f"no such file: {given} (give a config.json or the directory holding it)"
        return _failed(file, Problem("hf-config-not-found", given, message))
    try:
        with open(file, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        return _failed(file, Problem("hf-config-unreadable", file, f"not UTF-8 text: {error}"))
    except OSError as error:
        return _failed(file, Problem("hf-config-unreadable", file, f"cannot read: {error.strerror or error}"))
    return parse_hf_config(text, file)


def parse_hf_config(text: str, source: str) -> HfImport:
    """Map config.json text to Megatron settings; ``source`` names the file in locations."""
    duplicates: list[str] = []
    try:
        config = json.loads(text, object_pairs_hook=_pairs_hook(duplicates))
    except json.JSONDecodeError as error:
        return _failed(
            source,
            Problem(
                "hf-malformed-json",
                f"{source}:{error.lineno}",
                f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
            ),
        )
    if not isinstance(config, dict):
        return _failed(
            source,
            Problem("hf-malformed-json", f"{source}:1", "a config.json holds one JSON object {...}"),
        )
    reader = _Reader(config, _key_lines(text), source)
    for key in duplicates:
        reader.note(
            "hf-duplicate-key", key,
            f"{key} appears more than once; the last value is used (as HuggingFace does)",
        )

    model_type = config.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        reader.problem(
            "hf-missing-key", "",
            f"model_type is missing, so the architecture is unknown; supported model types: {supported}",
        )
    elif not isinstance(model_type, str):
        reader.problem(
            "hf-bad-value", "model_type",
            f"model_type must be a string, got {_show(model_type)}",
        )
    elif model_type not in _MAPPERS:
        reader.problem(
            "unsupported-hf-model", "model_type",
            f"{source} describes model_type {model_type!r}, which this importer does not map; "
            f"supported model types: {supported}",
        )
    else:
        _MAPPERS[model_type](reader)
        reader.note_unread_keys()
    return reader.result(reader.model_type)


# --------------------------------------------------------------------------------------------
# Reading values


_REQUIRED = object()


class _Reader:
    """Reads keys of one config, checks their values and records flags, problems and notes."""

    def __init__(self, config: dict, lines: dict[str, list[int]], source: str) -> None:
        self.config = config
        self.lines = lines
        self.source = source
        model_type = config.get("model_type")
        self.model_type = model_type if isinstance(model_type, str) else None
        self.class_name = _CONFIG_CLASS.get(self.model_type, "HuggingFace")
        self.problems = ProblemCollector()
        self.notes: list[HfNote] = []
        self.mapping: list[MappedFlag] = []
        self.settings: dict[str, RawSetting] = {}
        self.read: set[str] = {"model_type"}
        self.ignored: frozenset[str] = frozenset()

    # locations ------------------------------------------------------------------------------
    def where(self, key: str) -> str:
        """``config.json:LINE key`` (the last occurrence, which is the value JSON keeps)."""
        if not key:
            return self.source
        lines = self.lines.get(key)
        if lines:
            return f"{self.source}:{lines[-1]} {key}"
        if "." in key:  # a nested key the file does not spell out: name its object
            return self.where(key.rsplit(".", 1)[0])
        if key != "model_type" and "model_type" in self.lines:
            # An absent key: the value is implied by the architecture (or its default).
            return self.where("model_type")
        return self.source

    def problem(self, code: str, key: str, message: str) -> None:
        self.problems.add(code, self.where(key), message)

    def note(self, code: str, key: str, message: str) -> None:
        note = HfNote(code, self.where(key), message)
        if note not in self.notes:
            self.notes.append(note)

    # values ---------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.config

    def raw(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.config.get(key, default)

    def value(self, key: str, default: Any, check: Callable[[Any], bool], expected: str,
              *, allow_none: bool = False, note_default: bool = True) -> Any:
        """The key's value when valid; the default when absent (noted); None after a problem."""
        self.read.add(key)
        if key not in self.config:
            if default is _REQUIRED:
                self.problem(
                    "hf-missing-key", "",
                    f"{key} is missing: a {self.model_type} config.json states it ({expected})",
                )
                return None
            if note_default and default is not None:
                self.note(
                    "hf-default-used", key,
                    f"{key} is not in the file; using the {self.class_name} default {_show(default)}",
                )
            return default
        value = self.config[key]
        if value is None and allow_none:
            return None
        if value is None or not check(value):
            self.problem("hf-bad-value", key, f"{key} must be {expected}, got {_show(value)}")
            return None
        return value

    def positive_int(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> int | None:
        return self.value(key, default, _is_positive_int, "a positive integer", **kwargs)

    def count(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> int | None:
        return self.value(key, default, _is_count, "an integer >= 0", **kwargs)

    def number(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> float | None:
        return self.value(key, default, _is_number, "a number", **kwargs)

    def fraction(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> float | None:
        return self.value(key, default, _is_fraction, "a number from 0 to 1", **kwargs)

    def boolean(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> bool | None:
        return self.value(key, default, _is_bool, "true or false", **kwargs)

    def text(self, key: str, default: Any = _REQUIRED, **kwargs: Any) -> str | None:
        return self.value(key, default, _is_text, "a string", **kwargs)

    # output ---------------------------------------------------------------------------------
    def supply(self, flag: str, value: Any, hf_key: str) -> None:
        """Record ``flag`` (``value`` True for a switch), located at the first key named."""
        dest, kind = _FLAGS[flag]
        if kind == "switch":
            dest_value, value = True, True
        elif kind == "off":
            dest_value, value = False, True
        else:
            dest_value = value
        self.settings[dest] = RawSetting(dest, dest_value, self.where(hf_key.split("+")[0]))
        self.mapping.append(MappedFlag(hf_key, flag, value))

    def ignore(self, *keys: str) -> None:
        """Keys this architecture carries that do not change the model Megatron builds."""
        self.ignored = self.ignored | frozenset(keys)

    def note_unread_keys(self) -> None:
        for key in self.config:
            if key in self.read or key in self.ignored or key in _METADATA_KEYS:
                continue
            self.note(
                "hf-key-not-read", key,
                f"{key} is not read by the importer; if it changes the {self.model_type} "
                f"architecture, the Megatron flags do not reflect it",
            )

    def result(self, model_type: str | None) -> HfImport:
        if self.problems:
            raw, flags, mapping = RawArgs({}, self.source), (), ()
        else:
            raw = RawArgs(dict(self.settings), self.source)
            flags = _tokens(self.mapping)
            mapping = tuple(self.mapping)
        return HfImport(self.source, model_type, raw, flags, mapping, self.problems.problems, tuple(self.notes))


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_fraction(value: Any) -> bool:
    return _is_number(value) and 0 <= value <= 1


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (dict, list, str, bool)) or value is None else repr(value)


def _flag_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, list):
        return _layer_pattern_text(value)
    return str(value)


def _tokens(mapping: list[MappedFlag]) -> tuple[str, ...]:
    tokens: list[str] = []
    for item in mapping:
        tokens.append(item.flag)
        if item.value is not True:
            tokens.append(_flag_text(item.value))
    return tuple(tokens)


def _failed(source: str, problem: Problem) -> HfImport:
    return HfImport(source, None, RawArgs({}, source), (), (), (problem,), ())


def _pairs_hook(duplicates: list[str]) -> Callable[[list], dict]:
    def hook(pairs: list) -> dict:
        seen: dict = {}
        for key, value in pairs:
            if key in seen and key not in duplicates:
                duplicates.append(key)
            seen[key] = value
        return seen

    return hook


def _key_lines(text: str) -> dict[str, list[int]]:
    """Line numbers (1-based) of every object key, by dotted path (``rope_scaling.factor``).

    A small scan of valid JSON text: strings are skipped with the JSON decoder's own
    ``scanstring``; a string followed by ``:`` inside an object is a key.  Keys inside arrays
    are not indexed (config.json files keep the architecture in plain objects).
    """
    from json.decoder import scanstring

    line_starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            line_starts.append(index + 1)
    found: dict[str, list[int]] = {}
    # Each open container: (is_object, path prefix or None inside arrays, last key seen).
    stack: list[list] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char == '"':
            value, end = scanstring(text, index + 1)
            after = end
            while after < length and text[after] in " \t\r\n":
                after += 1
            if stack and stack[-1][0] and after < length and text[after] == ":":
                frame = stack[-1]
                frame[2] = value
                if frame[1] is not None:
                    path = ".".join(frame[1] + [value])
                    found.setdefault(path, []).append(bisect_right(line_starts, index))
            index = end
            continue
        if char in "{[":
            if not stack:
                prefix: list[str] | None = []
            elif stack[-1][0] and stack[-1][1] is not None and stack[-1][2] is not None:
                prefix = stack[-1][1] + [stack[-1][2]]
            else:
                prefix = None
            stack.append([char == "{", prefix, None])
        elif char in "}]":
            if stack:
                stack.pop()
        index += 1
    return found


# --------------------------------------------------------------------------------------------
# Architectures


_CONFIG_CLASS = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "qwen2": "Qwen2Config",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "deepseek_v2": "DeepseekV2Config",
    "deepseek_v3": "DeepseekV3Config",
    "gpt2": "GPT2Config",
    "gpt_neox": "GPTNeoXConfig",
}


@dataclass(frozen=True)
class _DecoderFamily:
    """How one LLaMA-like HuggingFace architecture differs from LLaMA (transformers' modeling_*.py)."""

    rms_norm_eps: float  # the config class default
    rope_theta: float  # the config class default
    qkv_bias: str  # "attention_bias": q,k,v,o biases from that key; "always": q,k,v only (Qwen2)
    qk_norm: bool = False  # RMSNorm on each q and k head (Qwen3)
    moe: str | None = None  # "mixtral" or "qwen"
    sliding_window: str | None = None  # "mistral": always on when set; "qwen": use_sliding_window
    kv_heads_default_is_heads: bool = False  # LlamaConfig: num_key_value_heads None -> heads


_FAMILIES = {
    "llama": _DecoderFamily(1e-6, 10000.0, "attention_bias", kv_heads_default_is_heads=True),
    "mistral": _DecoderFamily(1e-6, 10000.0, "none", sliding_window="mistral"),
    "mixtral": _DecoderFamily(1e-5, 1e6, "none", moe="mixtral", sliding_window="mistral"),
    "qwen2": _DecoderFamily(1e-6, 10000.0, "always", sliding_window="qwen"),
    "qwen2_moe": _DecoderFamily(1e-6, 10000.0, "always", moe="qwen", sliding_window="qwen"),
    "qwen3": _DecoderFamily(1e-6, 10000.0, "attention_bias", qk_norm=True, sliding_window="qwen"),
    "qwen3_moe": _DecoderFamily(1e-6, 10000.0, "attention_bias", qk_norm=True, moe="qwen", sliding_window="qwen"),
}


def _core_shape(r: _Reader) -> tuple:
    """Layers, hidden, ffn and heads as the config gives them (each read once)."""
    layers = r.positive_int("num_hidden_layers")
    hidden = r.positive_int("hidden_size")
    ffn = r.positive_int("intermediate_size")
    heads = r.positive_int("num_attention_heads")
    return layers, hidden, ffn, heads


def _supply_core_shape(r: _Reader, layers, hidden, ffn, heads) -> None:
    if layers:
        r.supply("--num-layers", layers, "num_hidden_layers")
    if hidden:
        r.supply("--hidden-size", hidden, "hidden_size")
    if ffn:
        r.supply("--ffn-hidden-size", ffn, "intermediate_size")
    if heads:
        r.supply("--num-attention-heads", heads, "num_attention_heads")


def _map_decoder(r: _Reader) -> None:
    """LLaMA 1/2/3/3.x, Mistral, Mixtral, Qwen2/2.5, Qwen3 and their MoE variants."""
    family = _FAMILIES[r.model_type]
    layers, hidden, ffn, heads = _core_shape(r)
    kv_default = heads if family.kv_heads_default_is_heads else _REQUIRED
    kv_heads = r.positive_int(
        "num_key_value_heads", kv_default, note_default=False, allow_none=family.kv_heads_default_is_heads
    )
    if kv_heads is None and family.kv_heads_default_is_heads:
        kv_heads = heads  # LlamaConfig: num_key_value_heads None means one per attention head
    _supply_core_shape(r, layers, hidden, ffn, heads)
    _query_groups(r, heads, kv_heads)
    head_dim = r.positive_int("head_dim", None, allow_none=True)
    if head_dim:
        # Qwen3 and newer LLaMA/Mistral configs state the head size; it need not be hidden/heads.
        r.supply("--kv-channels", head_dim, "head_dim")
    elif r.model_type == "qwen3" and not r.has("head_dim") and heads and hidden:
        r.note(
            "hf-default-used", "head_dim",
            f"head_dim is not in the file; using the {r.class_name} default 128",
        )
        r.supply("--kv-channels", 128, "head_dim")
    max_positions = r.positive_int("max_position_embeddings")
    if max_positions:
        r.supply("--max-position-embeddings", max_positions, "max_position_embeddings")
    _vocab(r, "vocab_size")
    _tie(r, default=False)

    r.supply("--normalization", "RMSNorm", "model_type")
    eps = r.number("rms_norm_eps", family.rms_norm_eps)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "rms_norm_eps")
    _gated_silu(r)
    _decoder_biases(r, family, hidden)
    if family.qk_norm:
        r.supply("--qk-layernorm", True, "model_type")
    _dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")
    r.supply("--position-embedding-type", "rope", "model_type")
    _rope(r, family.rope_theta)
    _sliding_window(r, family)
    r.ignore("pretraining_tp")  # LLaMA: tensor-parallel slicing used in pretraining; same math
    if family.moe == "mixtral":
        _mixtral_experts(r)
    elif family.moe == "qwen":
        _qwen_experts(r, layers)


def _query_groups(r: _Reader, heads: int | None, kv_heads: int | None) -> None:
    if heads and kv_heads and kv_heads != heads:
        r.supply("--group-query-attention", True, "num_key_value_heads")
        r.supply("--num-query-groups", kv_heads, "num_key_value_heads")


def _vocab(r: _Reader, key: str) -> None:
    vocab = r.positive_int(key)
    if vocab:
        r.supply("--vocab-size", vocab, key)
        if vocab % 128:
            padded = -(-vocab // 128) * 128
            r.note(
                "hf-vocab-padded", key,
                f"Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by "
                f"(128) x TP: {vocab} becomes {padded} at TP=1; pass "
                f"--make-vocab-size-divisible-by 1 to keep {vocab} (HuggingFace parameter counts use {vocab})",
            )


def _tie(r: _Reader, default: bool) -> None:
    tied = r.boolean("tie_word_embeddings", default, note_default=False)
    if tied is False:
        r.supply("--untie-embeddings-and-output-weights", True, "tie_word_embeddings")


def _gated_silu(r: _Reader) -> None:
    act = r.text("hidden_act", "silu")
    if act is None:
        return
    r.supply("--swiglu", True, "hidden_act")
    if act not in ("silu", "swish"):
        r.note(
            "hf-approximated", "hidden_act",
            f"hidden_act {act!r}: Megatron's gated MLP is built with --swiglu (SiLU); parameters "
            f"and activation shapes are the same, the activation function is not",
        )


def _decoder_biases(r: _Reader, family: _DecoderFamily, hidden: int | None) -> None:
    if family.qkv_bias == "always":
        # Qwen2/Qwen2-MoE: q_proj, k_proj, v_proj have biases; o_proj and the MLP do not.
        qkv = r.boolean("qkv_bias", True, note_default=False) if r.model_type == "qwen2_moe" else True
        r.supply("--disable-bias-linear", True, "model_type")
        if qkv:
            r.supply("--add-qkv-bias", True, "qkv_bias" if r.has("qkv_bias") else "model_type")
        return
    if family.qkv_bias == "none":
        r.supply("--disable-bias-linear", True, "model_type")
        return
    attention_bias = r.boolean("attention_bias", False, note_default=False)
    mlp_bias = r.boolean("mlp_bias", False, note_default=False) if r.model_type == "llama" else False
    if attention_bias is None or mlp_bias is None:
        return
    if not attention_bias and not mlp_bias:
        key = "attention_bias+mlp_bias" if r.model_type == "llama" else "attention_bias"
        r.supply("--disable-bias-linear", True, key if r.has("attention_bias") else "model_type")
    elif attention_bias and not mlp_bias:
        r.supply("--disable-bias-linear", True, "mlp_bias" if r.has("mlp_bias") else "model_type")
        r.supply("--add-qkv-bias", True, "attention_bias")
        r.note(
            "hf-approximated", "attention_bias",
            f"attention_bias true also gives o_proj a bias; Megatron can add q/k/v biases alone "
            f"(--add-qkv-bias) or every linear bias, so the o_proj bias ({hidden} parameters per "
            f"layer) is left out",
        )
    elif mlp_bias and not attention_bias:
        r.note(
            "hf-approximated", "mlp_bias",
            "mlp_bias true with attention_bias false: Megatron's bias switch covers every linear "
            "layer, so the attention output projection gets a bias the model does not have",
        )
    # Both true: Megatron's default (biases on every linear layer) matches.


def _dropout(r: _Reader, key: str, flag: str, default: float) -> None:
    value = r.fraction(key, default, note_default=False)
    if value is not None:
        r.supply(flag, float(value), key)


@dataclass(frozen=True)
class _RopeKeys:
    """Where a config keeps RoPE: ``rope_theta`` + ``rope_scaling`` or, from transformers 5,
    one ``rope_parameters`` object.  ``scaling`` is None for plain RoPE."""

    theta_key: str
    theta: Any
    scaling_key: str
    scaling: dict | None
    kind: str
    kind_key: str


def _rope_keys(r: _Reader, theta_key: str = "rope_theta") -> _RopeKeys:
    params = r.config.get("rope_parameters")
    if isinstance(params, dict):
        r.read.add("rope_parameters")
        kind_key = "rope_type" if "rope_type" in params else "type"
        kind = params.get(kind_key, "default")
        return _RopeKeys(
            "rope_parameters.rope_theta", params.get("rope_theta"), "rope_parameters",
            None if kind == "default" else params, kind, f"rope_parameters.{kind_key}",
        )
    r.read.add(theta_key)
    scaling = r.raw("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        r.problem(
            "hf-bad-value", "rope_scaling",
            f"rope_scaling must be an object or null, got {_show(scaling)}",
        )
        scaling = None
    kind_key = "rope_type" if scaling and "rope_type" in scaling else "type"
    kind = "default" if scaling is None else str(scaling.get(kind_key, "default"))
    return _RopeKeys(
        theta_key, r.config.get(theta_key), "rope_scaling",
        None if kind == "default" else scaling, kind, f"rope_scaling.{kind_key}",
    )


def _rotary_base(r: _Reader, rope: _RopeKeys, default: float) -> None:
    theta = rope.theta
    if theta is None:
        r.note(
            "hf-default-used", rope.theta_key,
            f"{rope.theta_key} is not in the file; using the {r.class_name} default "
            f"{_show(default)}",
        )
        theta = default
    if not _is_number(theta) or theta <= 0:
        r.problem(
            "hf-bad-value", rope.theta_key,
            f"{rope.theta_key} must be a positive number, got {_show(theta)}",
        )
        return
    base = int(round(theta))
    if base != theta:
        r.note(
            "hf-approximated", rope.theta_key,
            f"{rope.theta_key} {theta} is not an integer; Megatron's --rotary-base takes an "
            f"integer, {base}",
        )
    r.supply("--rotary-base", base, rope.theta_key)


def _rope(r: _Reader, default_theta: float, theta_key: str = "rope_theta") -> None:
    """RoPE base and scaling for standard attention.  Scaling changes positions, not memory."""
    rope = _rope_keys(r, theta_key)
    _rotary_base(r, rope, default_theta)
    scaling = rope.scaling
    if scaling is None:
        return
    factor = scaling.get("factor")
    if rope.kind == "llama3" and _is_number(factor):
        # megatron/core/models/common/embeddings/rotary_pos_embedding.py `_apply_scaling`:
        # low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192 are fixed.
        r.supply("--use-rope-scaling", True, rope.kind_key)
        r.supply("--rope-scaling-factor", float(factor), f"{rope.scaling_key}.factor")
        fixed = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
        differ = [f"{k} {scaling[k]} (Megatron uses {v})" for k, v in fixed.items() if k in scaling and scaling[k] != v]
        if differ:
            r.note(
                "hf-approximated", rope.scaling_key,
                "llama3 RoPE scaling with " + ", ".join(differ) + "; positions only, memory is unchanged",
            )
    elif rope.kind == "linear" and _is_number(factor) and float(factor).is_integer():
        r.supply("--rotary-seq-len-interpolation-factor", int(factor), f"{rope.scaling_key}.factor")
    else:
        r.note(
            "hf-not-mapped", rope.scaling_key,
            f"{rope.scaling_key} type {rope.kind!r} is not mapped to a Megatron flag; RoPE scaling "
            f"changes positions only, so parameters and memory are unchanged",
        )


def _sliding_window(r: _Reader, family: _DecoderFamily) -> None:
    if family.sliding_window is None:
        return
    if family.sliding_window == "mistral":
        window = r.positive_int("sliding_window", None, allow_none=True, note_default=False)
        if window:
            # TransformerConfig.window_size is (left, right); causal attention looks left only.
            r.supply("--window-size", (window, 0), "sliding_window")
            r.note(
                "hf-approximated", "sliding_window",
                f"sliding-window attention over {window} tokens: parameters and flash-attention "
                f"memory are unchanged; unfused attention still builds full s x s scores",
            )
        return
    if r.boolean("use_mrope", False, note_default=False):
        r.note(
            "hf-not-mapped", "use_mrope",
            "use_mrope (multimodal RoPE sections) is not mapped; positions only, memory unchanged",
        )
    use = r.boolean("use_sliding_window", False, note_default=False)
    r.ignore("sliding_window", "max_window_layers")  # inactive unless use_sliding_window
    layer_types = r.raw("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        r.note(
            "hf-not-mapped", "layer_types",
            "layer_types names sliding-window layers; Megatron is given full attention on every "
            "layer (same parameters and flash-attention memory)",
        )
    if use:
        r.note(
            "hf-not-mapped", "use_sliding_window",
            "use_sliding_window true (sliding window on layers from max_window_layers on) is not "
            "mapped: Megatron is given full attention; parameters and flash-attention memory are the same",
        )


def _mixtral_experts(r: _Reader) -> None:
    experts = r.positive_int("num_local_experts")
    topk = r.positive_int("num_experts_per_tok")
    if experts:
        r.supply("--num-experts", experts, "num_local_experts")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    # Expert width is intermediate_size: Megatron's moe_ffn_hidden_size defaults to
    # ffn_hidden_size (validate_args in megatron/training/arguments.py).
    jitter = r.number("router_jitter_noise", 0.0, note_default=False)
    if jitter:
        r.note(
            "hf-not-mapped", "router_jitter_noise",
            "router_jitter_noise is a training-time router perturbation; not mapped (no memory "
            "effect)",
        )
    r.ignore(*_MOE_TRAINING_KEYS)


def _qwen_experts(r: _Reader, layers: int | None) -> None:
    experts = r.count("num_experts")
    topk = r.positive_int("num_experts_per_tok")
    moe_ffn = r.positive_int("moe_intermediate_size")
    step = r.positive_int("decoder_sparse_step", 1, note_default=False)
    only_dense = r.raw("mlp_only_layers", [])
    if only_dense is None:
        only_dense = []
    if not isinstance(only_dense, list) or not all(_is_count(i) for i in only_dense):
        r.problem(
            "hf-bad-value", "mlp_only_layers",
            f"mlp_only_layers must be a list of layer indices, got {_show(only_dense)}",
        )
        only_dense = None
    if r.model_type == "qwen2_moe":
        shared = r.count("shared_expert_intermediate_size")
    else:
        shared = 0
    norm_topk = r.boolean("norm_topk_prob", False, note_default=False)
    r.ignore(*_MOE_TRAINING_KEYS)
    if experts == 0:
        return  # no experts: every layer is the dense MLP of intermediate_size
    if not (experts and topk and moe_ffn and step and layers) or only_dense is None or norm_topk is None:
        return
    r.supply("--num-experts", experts, "num_experts")
    r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    # transformers modeling_qwen2_moe.py / modeling_qwen3_moe.py: a layer is sparse when it is not
    # in mlp_only_layers and (index + 1) % decoder_sparse_step == 0.
    pattern = [0 if (i in only_dense or (i + 1) % step) else 1 for i in range(layers)]
    if any(p == 0 for p in pattern):
        key = "decoder_sparse_step+mlp_only_layers" if only_dense else "decoder_sparse_step"
        r.supply("--moe-layer-freq", pattern, key)
    if shared:
        r.supply("--moe-shared-expert-intermediate-size", shared, "shared_expert_intermediate_size")
        # Qwen2-MoE scales the shared expert by sigmoid(shared_expert_gate(x)), an h -> 1 linear.
        r.supply("--moe-shared-expert-gate", True, "model_type")
    if not norm_topk:
        # Softmax over all experts, then top-k without renormalising: Megatron's pre-softmax
        # router (megatron/core/transformer/moe/moe_utils.py topk_softmax_with_capacity).
        r.supply("--moe-router-pre-softmax", True, "norm_topk_prob")


def _map_deepseek(r: _Reader) -> None:
    """DeepSeek-V2 / V2-Lite / V3: MLA attention, shared + routed experts, optional MTP."""
    v3 = r.model_type == "deepseek_v3"
    layers, hidden, ffn, heads = _core_shape(r)
    _supply_core_shape(r, layers, hidden, ffn, heads)
    r.ignore("pretraining_tp")
    r.ignore("num_key_value_heads")  # MLA has no key/value head groups (DeepSeek sets it = heads)
    max_positions = r.positive_int("max_position_embeddings")
    if max_positions:
        r.supply("--max-position-embeddings", max_positions, "max_position_embeddings")
    _vocab(r, "vocab_size")
    _tie(r, default=False)
    r.supply("--normalization", "RMSNorm", "model_type")
    eps = r.number("rms_norm_eps", 1e-6)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "rms_norm_eps")
    _gated_silu(r)
    if r.boolean("attention_bias", False, note_default=False):
        r.note(
            "hf-approximated", "attention_bias",
            "attention_bias true: Megatron's MLA is built without attention biases",
        )
    r.supply("--disable-bias-linear", True, "attention_bias" if r.has("attention_bias") else "model_type")
    _dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")

    # Multi-latent attention (megatron/core/transformer/multi_latent_attention.py).
    r.supply("--multi-latent-attention", True, "model_type")
    if "q_lora_rank" not in r.config:
        r.value("q_lora_rank", _REQUIRED, _is_positive_int, "a positive integer or null (no query compression)")
    q_lora = r.positive_int("q_lora_rank", None, allow_none=True)
    if q_lora:
        r.supply("--q-lora-rank", q_lora, "q_lora_rank")
    for key, flag in (
        ("kv_lora_rank", "--kv-lora-rank"),
        ("qk_nope_head_dim", "--qk-head-dim"),
        ("qk_rope_head_dim", "--qk-pos-emb-head-dim"),
        ("v_head_dim", "--v-head-dim"),
    ):
        value = r.positive_int(key)
        if value:
            r.supply(flag, value, key)
    # The q_a_layernorm (when q_lora_rank is set) and kv_a_layernorm are MLA's q/kv layernorms.
    r.supply("--qk-layernorm", True, "model_type")
    # MTP needs --position-embedding-type rope (validate_args); MLA applies its own RoPE/YaRN.
    r.supply("--position-embedding-type", "rope", "model_type")
    _mla_rope(r)

    # Experts (transformers modeling_deepseek_v2/v3.py: a layer is MoE when n_routed_experts is
    # set, index >= first_k_dense_replace and index % moe_layer_freq == 0).
    experts = r.positive_int("n_routed_experts", None, allow_none=True, note_default=False)
    if experts is None and "n_routed_experts" in r.config and r.config["n_routed_experts"] is not None:
        return  # bad value already reported
    r.ignore(*_MOE_TRAINING_KEYS)
    mtp = r.count("num_nextn_predict_layers", 0, note_default=False) if v3 else 0
    if not experts:
        r.ignore("moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace",
                 "moe_layer_freq", "topk_method", "n_group", "topk_group", "scoring_func",
                 "norm_topk_prob", "routed_scaling_factor")
    else:
        _deepseek_experts(r, experts, layers, v3)
    if mtp:
        r.supply("--mtp-num-layers", mtp, "num_nextn_predict_layers")
    quant = r.raw("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        r.note(
            "hf-not-mapped", "quantization_config",
            f"quantization_config ({method}) describes how the checkpoint is stored; Megatron "
            f"trains in the precision chosen by its own flags (--bf16, --fp8-format, ...)",
        )


def _mla_rope(r: _Reader) -> None:
    rope = _rope_keys(r)
    _rotary_base(r, rope, 10000.0)
    scaling = rope.scaling
    if scaling is None or rope.kind != "yarn":
        key = rope.kind_key if scaling is not None else ("rope_scaling" if r.has("rope_scaling") else "model_type")
        r.supply("--rope-type", "rope", key)
        # MLATransformerConfig.__post_init__ rejects rope fusion unless rope_type is yarn.
        r.supply("--no-rope-fusion", True, key)
    if scaling is None:
        return
    if rope.kind != "yarn":
        r.note(
            "hf-not-mapped", rope.scaling_key,
            f"{rope.scaling_key} type {rope.kind!r} is not mapped for MLA (plain RoPE is used); "
            "positions only, memory unchanged",
        )
        return
    r.supply("--rope-type", "yarn", rope.kind_key)
    for key, flag in (("factor", "--rotary-scaling-factor"), ("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim")):
        if key in scaling:
            name = f"{rope.scaling_key}.{key}"
            if _is_number(scaling[key]):
                r.supply(flag, float(scaling[key]), name)
            else:
                r.problem("hf-bad-value", name, f"{name} must be a number, got {_show(scaling[key])}")
    # MLATransformerConfig (megatron/core/transformer/transformer_config.py) fixes these; no flag.
    fixed = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    differ = [f"{k} {scaling[k]} (Megatron's MLA uses {v})" for k, v in fixed.items() if k in scaling and scaling[k] != v]
    if differ:
        r.note(
            "hf-approximated", rope.scaling_key,
            "YaRN with " + ", ".join(differ) + "; positions only, memory unchanged",
        )


def _deepseek_experts(r: _Reader, experts: int, layers: int | None, v3: bool) -> None:
    moe_ffn = r.positive_int("moe_intermediate_size")
    topk = r.positive_int("num_experts_per_tok")
    shared = r.count("n_shared_experts", None, allow_none=True, note_default=False) or 0
    first_dense = r.count("first_k_dense_replace", 0, note_default=False)
    freq = r.positive_int("moe_layer_freq", 1, note_default=False)
    r.supply("--num-experts", experts, "n_routed_experts")
    if moe_ffn:
        r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    if layers and first_dense is not None and freq:
        pattern = [1 if (i >= first_dense and i % freq == 0) else 0 for i in range(layers)]
        if any(p == 0 for p in pattern):
            r.supply("--moe-layer-freq", pattern, "first_k_dense_replace+moe_layer_freq")
    if shared and moe_ffn:
        r.supply("--moe-shared-expert-intermediate-size", shared * moe_ffn, "n_shared_experts+moe_intermediate_size")

    # Routing: softmax (V2) or sigmoid (V3) scores; group-limited top-k; V3's aux-loss-free bias.
    scoring = r.text("scoring_func", "sigmoid" if v3 else "softmax", note_default=False)
    method = r.text("topk_method", "noaux_tc" if v3 else "greedy", note_default=False)
    norm_topk = r.boolean("norm_topk_prob", v3, note_default=False)
    groups = r.positive_int("n_group", None, allow_none=True, note_default=False)
    group_topk = r.positive_int("topk_group", None, allow_none=True, note_default=False)
    scale = r.number("routed_scaling_factor", 2.5 if v3 else 1.0, note_default=False)
    if scoring in ("softmax", "sigmoid"):
        if scoring == "sigmoid":
            r.supply("--moe-router-score-function", "sigmoid", "scoring_func")
    elif scoring is not None:
        r.note(
            "hf-not-mapped", "scoring_func",
            f"scoring_func {scoring!r} is not mapped; Megatron's softmax router is used (no "
            "memory effect)",
        )
    if method == "noaux_tc":
        # e_score_correction_bias: Megatron keeps it as the router's expert_bias buffer (not a parameter).
        r.supply("--moe-router-enable-expert-bias", True, "topk_method")
    if method in ("group_limited_greedy", "noaux_tc") and groups and groups > 1 and group_topk:
        r.supply("--moe-router-num-groups", groups, "n_group")
        r.supply("--moe-router-group-topk", group_topk, "topk_group")
    elif method not in (None, "greedy", "group_limited_greedy", "noaux_tc"):
        r.note(
            "hf-not-mapped", "topk_method",
            f"topk_method {method!r} is not mapped (routing only, no memory effect)",
        )
    if scoring == "softmax" and norm_topk is False:
        r.supply("--moe-router-pre-softmax", True, "norm_topk_prob")
    if scoring == "sigmoid" and norm_topk is False and topk and topk > 1:
        r.note(
            "hf-approximated", "norm_topk_prob",
            "sigmoid routing without renormalised top-k: Megatron renormalises (routing only, no "
            "memory effect)",
        )
    if scale is not None and scale != 1.0:
        r.supply("--moe-router-topk-scaling-factor", float(scale), "routed_scaling_factor")


def _map_gpt2(r: _Reader) -> None:
    """GPT-2: learned absolute positions, LayerNorm, GeLU MLP, biases everywhere, tied output."""
    layers = r.positive_int("n_layer")
    hidden = r.positive_int("n_embd")
    heads = r.positive_int("n_head")
    inner = r.positive_int("n_inner", None, allow_none=True, note_default=False)
    positions = r.positive_int("n_positions")
    if layers:
        r.supply("--num-layers", layers, "n_layer")
    if hidden:
        r.supply("--hidden-size", hidden, "n_embd")
    if hidden and not (r.has("n_inner") and r.config["n_inner"] is not None and inner is None):
        # GPT2MLP: inner_dim = n_inner if set, else 4 * n_embd.
        r.supply("--ffn-hidden-size", inner or 4 * hidden, "n_inner")
    if heads:
        r.supply("--num-attention-heads", heads, "n_head")
    if positions:
        r.supply("--max-position-embeddings", positions, "n_positions")
    _vocab(r, "vocab_size")
    _tie(r, default=True)
    r.supply("--normalization", "LayerNorm", "model_type")
    eps = r.number("layer_norm_epsilon", 1e-5)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "layer_norm_epsilon")
    r.supply("--position-embedding-type", "learned_absolute", "model_type")
    # Biases on every linear layer are Megatron's default (add_bias_linear True).
    act = r.text("activation_function", "gelu_new")
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        r.note(
            "hf-approximated", "activation_function",
            f"activation_function {act!r} is the tanh GeLU; Megatron's default GeLU is the tanh "
            f"form when bias-GeLU fusion is on (its default) and erf otherwise; same memory",
        )
    elif act not in (None, "gelu"):
        r.note(
            "hf-approximated", "activation_function",
            f"activation_function {act!r} is not available; Megatron's GeLU is used (same "
            "parameters)",
        )
    attn = r.fraction("attn_pdrop", 0.1, note_default=False)
    resid = r.fraction("resid_pdrop", 0.1, note_default=False)
    embd = r.fraction("embd_pdrop", 0.1, note_default=False)
    if attn is not None:
        r.supply("--attention-dropout", float(attn), "attn_pdrop")
    if resid is not None:
        r.supply("--hidden-dropout", float(resid), "resid_pdrop")
    if embd is not None and resid is not None and embd != resid:
        r.note(
            "hf-approximated", "embd_pdrop",
            f"embd_pdrop {embd} differs from resid_pdrop {resid}; Megatron applies "
            "--hidden-dropout to the embeddings too",
        )
    if r.boolean("scale_attn_by_inverse_layer_idx", False, note_default=False):
        r.note(
            "hf-not-mapped", "scale_attn_by_inverse_layer_idx",
            "attention scaled by 1/layer index is not mapped (no parameter or memory effect)",
        )
    if r.boolean("scale_attn_weights", True, note_default=False) is False:
        r.note(
            "hf-not-mapped", "scale_attn_weights",
            "unscaled attention scores are not mapped (no parameter or memory effect)",
        )
    r.ignore("n_ctx", "reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
             "summary_proj_to_labels", "summary_first_dropout")


def _map_gpt_neox(r: _Reader) -> None:
    """GPT-NeoX / Pythia: rotary on part of each head, LayerNorm, GeLU, biases, parallel residual."""
    layers, hidden, ffn, heads = _core_shape(r)
    _supply_core_shape(r, layers, hidden, ffn, heads)
    max_positions = r.positive_int("max_position_embeddings")
    if max_positions:
        r.supply("--max-position-embeddings", max_positions, "max_position_embeddings")
    _vocab(r, "vocab_size")
    _tie(r, default=False)
    r.supply("--normalization", "LayerNorm", "model_type")
    eps = r.number("layer_norm_eps", 1e-5)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "layer_norm_eps")
    act = r.text("hidden_act", "gelu")
    if act not in (None, "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
        r.note(
            "hf-approximated", "hidden_act",
            f"hidden_act {act!r}: Megatron's GeLU MLP is used (same parameters)",
        )
    if r.boolean("attention_bias", True, note_default=False) is False:
        r.supply("--disable-bias-linear", True, "attention_bias")
        r.note(
            "hf-approximated", "attention_bias",
            "attention_bias false: GPT-NeoX keeps MLP biases, Megatron's --disable-bias-linear "
            "removes them too",
        )
    _dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    _dropout(r, "hidden_dropout", "--hidden-dropout", 0.0)
    r.supply("--position-embedding-type", "rope", "model_type")
    rotary_pct = r.fraction("rotary_pct", 0.25)
    if rotary_pct is not None:
        r.supply("--rotary-percent", float(rotary_pct), "rotary_pct")
    # GPTNeoXConfig names the RoPE base rotary_emb_base (rope_theta in newer transformers).
    _rope(r, 10000.0, "rotary_emb_base" if r.has("rotary_emb_base") else "rope_theta")
    if r.boolean("use_parallel_residual", True, note_default=False):
        r.note(
            "hf-approximated", "use_parallel_residual",
            "use_parallel_residual: GPT-NeoX adds attention and MLP outputs to the same input "
            "(x + attn(ln1(x)) + mlp(ln2(x))); Megatron has no parallel residual and runs them in "
            "sequence. Parameters are identical; activations are estimated for the sequential form",
        )
    r.ignore("classifier_dropout")


_MAPPERS: dict[str, Callable[[_Reader], None]] = {
    **{name: _map_decoder for name in _FAMILIES},
    "deepseek_v2": _map_deepseek,
    "deepseek_v3": _map_deepseek,
    "gpt2": _map_gpt2,
    "gpt_neox": _map_gpt_neox,
}


def _layer_pattern_text(pattern: list[int]) -> str:
    """Megatron's --moe-layer-freq list syntax: ``([0]*3+[1]*58)`` or ``([1]*3+[0])*12``."""
    length = len(pattern)
    for period in range(1, length + 1):
        if length % period == 0 and pattern[:period] * (length // period) == pattern:
            break
    unit = pattern[:period]
    runs: list[str] = []
    start = 0
    for index in range(1, period + 1):
        if index == period or unit[index] != unit[start]:
            size = index - start
            runs.append(f"[{unit[start]}]" if size == 1 else f"[{unit[start]}]*{size}")
            start = index
    body = "+".join(runs)
    repeat = length // period
    return f"({body})" if repeat == 1 else f"({body})*{repeat}"
