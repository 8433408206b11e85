"""The vocabulary size Megatron would build its embedding for.

Order (the first that answers wins):
1. ``--padded-vocab-size`` (used as is), ``--vocab-size`` (padded as Megatron pads it);
2. the tokenizer's files, when they exist on disk: ``--vocab-file`` (a JSON token->id map
   or a text file with one token per line), ``--tokenizer-model`` (a HuggingFace
   ``tokenizer.json``, a directory holding one, a SentencePiece ``.model`` file);
3. a table of well-known tokenizers (``GPT2BPETokenizer`` = 50257, well-known HuggingFace
   model names for ``--tokenizer-model``);
4. otherwise no answer: the caller asks for ``--vocab-size``.

Padding follows megatron/core/tokenizers/utils/build_tokenizer.py ``vocab_size_with_padding``:
``ceil(V / (make_vocab_size_divisible_by * tp)) * make_vocab_size_divisible_by * tp``.
The TikTokenizer always builds ``--vocab-size`` entries (default 2**17,
megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py).
Path-valued flags are never opened unless they exist; nothing else is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping
from megatron_estimator.megatron.releases import DEFAULT_RELEASE, ChosenRelease
from megatron_estimator.core.resources import read_input_bytes

# Tokenizer types whose vocabulary size is fixed by the tokenizer itself
# (files Megatron's recipes download; sizes as the tokenizers report len(tokenizer)).
KNOWN_TOKENIZER_TYPES = {
    "GPT2BPETokenizer": 50257,
    "BertWordPieceLowerCase": 30522,
    "BertWordPieceCase": 28996,
}

# Well-known HuggingFace tokenizers, matched on the --tokenizer-model name (lower case).
# Values are len(tokenizer) as the HuggingFace tokenizer reports it, which is what Megatron's
# HuggingFaceTokenizer uses as vocab_size.
KNOWN_TOKENIZER_MODELS = (
    ("llama-3", 128256),
    ("llama3", 128256),
    ("llama-2", 32000),
    ("llama2", 32000),
    ("mixtral", 32000),
    ("mistral-7b-v0.1", 32000),
    ("gpt-neox-20b", 50277),
    ("qwen2.5", 151665),
    ("qwen3", 151669),
    ("gpt2", 50257),
)

TIKTOKEN_DEFAULT_VOCAB = 2**17


@dataclass(frozen=True)
class Vocabulary:
    size: int | None          # unpadded size; None when only a padded size was given
    padded_size: int
    source: str               # a sentence for the report: where the size came from


def pad_vocab_size(size: int, divisible_by: int, tp: int) -> int:
    multiple = divisible_by * tp
    return -(-size // multiple) * multiple


def _count_vocab_file(path: str) -> int | None:
    """Entries in a --vocab-file: a JSON object (GPT-2 vocab.json) or one token per line."""
    try:
        data = read_input_bytes(path, "vocab")
    except OSError:
        return None
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        import json

        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if isinstance(obj, dict):
            if "model" in obj:  # a tokenizer.json given as the vocab file
                return _count_tokenizer_json(obj)
            return len(obj)
        return None
    return sum(1 for line in data.splitlines() if line.strip())


def _count_tokenizer_json(obj: dict) -> int | None:
    """len(tokenizer) for a HuggingFace tokenizer.json: model vocab plus added tokens not in it."""
    model = obj.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        ids = set(vocab.values())
    elif isinstance(vocab, list):  # Unigram: a list of [piece, score]
        ids = set(range(len(vocab)))
    else:
        return None
    for token in obj.get("added_tokens") or ():
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            ids.add(token["id"])
    return len(ids)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _count_sentencepiece_model(data: bytes) -> int | None:
    """Pieces in a SentencePiece ModelProto: the repeated field 1 at top level."""
    pos, count = 0, 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            field, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _read_varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 2:
                length, pos = _read_varint(data, pos)
                pos += length
                if field == 1:
                    count += 1
            elif wire == 5:
                pos += 4
            else:
                return None
    except IndexError:
        return None
    return count or None


def _count_tokenizer_model(path: str) -> int | None:
    if os.path.isdir(path):
        candidate = os.path.join(path, "tokenizer.json")
        if os.path.isfile(candidate):
            path = candidate
        else:
            candidate = os.path.join(path, "tokenizer.model")
            if not os.path.isfile(candidate):
                return None
            path = candidate
    try:
        data = read_input_bytes(path, "tokenizer")
    except OSError:
        return None
    if data.lstrip().startswith(b"{"):
        import json

        try:
            return _count_tokenizer_json(json.loads(data))
        except (ValueError, RecursionError):
            return None
    return _count_sentencepiece_model(data)


def _known_model_size(name: str) -> int | None:
    lowered = name.lower()
    for key, size in KNOWN_TOKENIZER_MODELS:
        if key in lowered:
            return size
    return None


def resolve_vocabulary(
    *,
    vocab_size: int | None,
    padded_vocab_size: int | None,
    tokenizer_type: str | None,
    vocab_file: str | None,
    tokenizer_model: str | None,
    make_vocab_size_divisible_by: int,
    tp: int,
    pad: bool = True,
    release: ChosenRelease = DEFAULT_RELEASE,
) -> Vocabulary | None:
    """The vocabulary Megatron builds (``release``: the run's Megatron release), or None when
    nothing tells its size."""

    def padded(size: int, source: str) -> Vocabulary:
        if not pad:
            return Vocabulary(size, size, source + " (padding disabled by --no-pad-vocab-size)")
        result = pad_vocab_size(size, make_vocab_size_divisible_by, tp)
        return Vocabulary(
            size, result,
            f"{source}, padded to {result} (multiple of {make_vocab_size_divisible_by} x tp {tp})",
        )

    if padded_vocab_size is not None:
        return Vocabulary(vocab_size, padded_vocab_size, f"--padded-vocab-size {padded_vocab_size}")
    if tokenizer_type == "TikTokenizer":
        size = vocab_size or TIKTOKEN_DEFAULT_VOCAB
        return padded(size, f"TikTokenizer with {size} entries")
    if vocab_size is not None and tokenizer_type == "NullTokenizer":
        # megatron/core/tokenizers/text/libraries/null_tokenizer.py, per release
        # (data/megatron_behaviour.tsv null_tokenizer_eod_extra): through 0.17 the
        # end-of-document token is id vocab_size, so the tokenizer's size (what Megatron pads)
        # is one more; from c9dfe34798 (0.18.0) it is --vocab-size itself.
        from megatron_estimator.megatron.behaviour import behaviour

        if behaviour("null_tokenizer_eod_extra", release) == "1":
            return padded(vocab_size + 1, f"--vocab-size {vocab_size} + NullTokenizer's end-of-document token "
                                          f"(Megatron {release.version})")
        return padded(vocab_size, f"--vocab-size {vocab_size} (NullTokenizer, Megatron {release.version}: "
                                  "the end-of-document token is within it)")
    if vocab_size is not None:
        return padded(vocab_size, f"--vocab-size {vocab_size}")
    if vocab_file:
        count = _count_vocab_file(vocab_file) if os.path.exists(vocab_file) else None
        if count:
            return padded(count, f"{count} entries in --vocab-file {vocab_file}")
    if tokenizer_model:
        count = _count_tokenizer_model(tokenizer_model) if os.path.exists(tokenizer_model) else None
        if count:
            return padded(count, f"{count} entries in --tokenizer-model {tokenizer_model}")
    if tokenizer_type in KNOWN_TOKENIZER_TYPES:
        size = KNOWN_TOKENIZER_TYPES[tokenizer_type]
        return padded(size, f"{tokenizer_type} has {size} entries")
    # SFTTokenizer loads the same AutoTokenizer and takes len(tokenizer) as its vocab_size
    # (megatron/core/tokenizers/text/libraries/sft_tokenizer.py:59-67, Megatron-LM main 2026-08).
    if tokenizer_model and tokenizer_type in ("HuggingFaceTokenizer", "SFTTokenizer", None):
        size = _known_model_size(tokenizer_model)
        if size:
            return padded(size, f"tokenizer {tokenizer_model} has {size} entries")
    return None


def unreadable_tokenizer_file(namespace: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(dest, why)`` when the vocabulary would be read from a tokenizer file that is on disk
    but cannot be read (Megatron could not load it either); None otherwise."""
    if namespace.get("vocab_size") is not None or namespace.get("padded_vocab_size") is not None \
            or namespace.get("tokenizer_type") == "TikTokenizer":
        return None
    vocab_file = namespace.get("vocab_file")
    if vocab_file and os.path.exists(vocab_file):
        if os.path.isdir(vocab_file):
            return "vocab_file", f"--vocab-file {vocab_file} is a directory, not a vocabulary file"
        if not _count_vocab_file(vocab_file):
            return "vocab_file", (f"--vocab-file {vocab_file} cannot be read as a vocabulary (a JSON object of "
                                  "tokens, a tokenizer.json, or one token per line)")
        return None
    tokenizer_model = namespace.get("tokenizer_model")
    if tokenizer_model and os.path.exists(tokenizer_model) and not _count_tokenizer_model(tokenizer_model):
        return "tokenizer_model", (f"--tokenizer-model {tokenizer_model} is on this machine but cannot be read as "
                                   "a tokenizer (a tokenizer.json, a SentencePiece model, or a directory holding one)")
    return None


def vocabulary_of(namespace: Mapping[str, Any], tp: int, release: ChosenRelease) -> Vocabulary | None:
    """The vocabulary a Megatron namespace (argparse dests) builds at tensor parallel size tp,
    as release ``release`` builds it.

    An unset --tokenizer-type is pretrain_gpt.py's GPT2BPETokenizer (its args_defaults)."""
    return resolve_vocabulary(
        vocab_size=namespace.get("vocab_size"),
        padded_vocab_size=namespace.get("padded_vocab_size"),
        tokenizer_type=namespace.get("tokenizer_type") or "GPT2BPETokenizer",
        vocab_file=namespace.get("vocab_file"),
        tokenizer_model=namespace.get("tokenizer_model"),
        make_vocab_size_divisible_by=namespace.get("make_vocab_size_divisible_by") or 128,
        tp=tp,
        pad=bool(namespace.get("pad_vocab_size", True)),
        release=release,
    )
