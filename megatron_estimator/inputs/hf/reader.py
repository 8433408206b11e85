"""Reading one HuggingFace config.json: each key's value checked, where each key is in the file
(``config.json:LINE key``), and the flags, problems and notes the mapping records.

``ConfigReader`` is what every architecture's mapper works through (``decoder``, ``deepseek``,
``gpt``); ``key_lines`` finds the line of every key in the JSON text.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from typing import Any, Callable

from megatron_estimator.megatron.releases import NEWEST
from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.hf.result import SUPPLIED_FLAGS, HfImport, MappedFlag, flag_tokens
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting


# Keys every HuggingFace config may carry that say nothing about the architecture's shape:
# identity, tokenizer ids, dtype of the stored checkpoint, inference and fine-tuning heads.
METADATA_KEYS = frozenset(
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
MOE_TRAINING_KEYS = frozenset(
    {"output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "ep_size"}
)


CONFIG_CLASS = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "qwen2": "Qwen2Config",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "deepseek_v2": "DeepseekV2Config",
    "deepseek_v3": "DeepseekV3Config",
    "deepseek_v32": "DeepseekV32Config",
    "glm4_moe": "Glm4MoeConfig",
    "kimi_k2": "DeepseekV3Config",  # the checkpoint's auto_map: configuration_deepseek.DeepseekV3Config
    "gpt2": "GPT2Config",
    "gpt_neox": "GPTNeoXConfig",
    "nemotron_h": "NemotronHConfig",
    "gpt_oss": "GptOssConfig",
    "qwen3_next": "Qwen3NextConfig",
}


REQUIRED = object()


class ConfigReader:
    """Reads keys of one config, checks their values and records flags, problems and notes."""

    def __init__(self, config: dict, lines: dict[str, list[int]], source: str, release: str = NEWEST) -> None:
        self.config = config
        self.release = release      # the label of the release whose flags the mapping writes
        self.lines = lines
        self.source = source
        model_type = config.get("model_type")
        self.model_type = model_type if isinstance(model_type, str) else None
        self.class_name = CONFIG_CLASS.get(self.model_type, "HuggingFace")
        self.problems = ProblemCollector()
        self.notes: list[Problem] = []
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
        note = Problem(code, self.where(key), message)
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
            if default is REQUIRED:
                self.problem(
                    "hf-missing-key", "",
                    f"{key} is missing: a {self.model_type} config.json states it ({expected})",
                )
                return None
            if note_default and default is not None:
                self.note(
                    "hf-default-used", key,
                    f"{key} is not in the file; using the {self.class_name} default {show_value(default)}",
                )
            return default
        value = self.config[key]
        if value is None and allow_none:
            return None
        if value is None or not check(value):
            self.problem("hf-bad-value", key, f"{key} must be {expected}, got {show_value(value)}")
            return None
        return value

    def positive_int(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> int | None:
        return self.value(key, default, is_positive_int, "a positive integer", **kwargs)

    def count(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> int | None:
        return self.value(key, default, is_count, "an integer >= 0", **kwargs)

    def number(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> float | None:
        return self.value(key, default, is_number, "a number", **kwargs)

    def fraction(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> float | None:
        return self.value(key, default, is_fraction, "a number from 0 to 1", **kwargs)

    def boolean(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> bool | None:
        return self.value(key, default, is_bool, "true or false", **kwargs)

    def text(self, key: str, default: Any = REQUIRED, **kwargs: Any) -> str | None:
        return self.value(key, default, is_text, "a string", **kwargs)

    # output ---------------------------------------------------------------------------------
    def supply(self, flag: str, value: Any, hf_key: str) -> None:
        """Record ``flag`` (``value`` True for a switch), located at the first key named."""
        dest, kind = SUPPLIED_FLAGS[flag]
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
            if key in self.read or key in self.ignored or key in METADATA_KEYS:
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
            flags = flag_tokens(self.mapping)
            mapping = tuple(self.mapping)
        return HfImport(self.source, model_type, raw, flags, mapping, self.problems.problems, tuple(self.notes))


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_fraction(value: Any) -> bool:
    return is_number(value) and 0 <= value <= 1


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def show_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (dict, list, str, bool)) or value is None else repr(value)


def pairs_hook(duplicates: list[str]) -> Callable[[list], dict]:
    def hook(pairs: list) -> dict:
        seen: dict = {}
        for key, value in pairs:
            if key in seen and key not in duplicates:
                duplicates.append(key)
            seen[key] = value
        return seen

    return hook


def key_lines(text: str) -> dict[str, list[int]]:
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
