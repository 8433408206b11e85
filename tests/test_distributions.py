"""core/distributions.py: metadata folder names as importlib.metadata's folders are named
(NAME-VERSION.dist-info, NAME[-VERSION[-REST]].egg-info; PEP 503 name normalisation)."""

from __future__ import annotations

from megatron_estimator.core.distributions import metadata_folder_name, normalized

# (folder, expected (name, kind) or None), each worked out by hand from the naming rule.
FOLDERS = [
    ("torch-2.13.0.dist-info", ("torch", "dist-info")),
    ("flash_attn-2.7.4.post1.dist-info", ("flash_attn", "dist-info")),
    ("megatron_core-0.16.1.dist-info", ("megatron_core", "dist-info")),
    ("transformer_engine-2.9.0-py3.11.egg-info", ("transformer_engine", "egg-info")),
    ("Foo.EGG-INFO", ("Foo", "egg-info")),              # kind is case-blind
    ("pip-24.0.dist-info", ("pip", "dist-info")),
    ("x-.dist-info", None),                              # an empty version
    ("-x.dist-info", None),                              # a name must start with a letter or digit
    (".dist-info", None),
    ("a-1-/x.dist-info", None),                          # the rest may not hold '/'
    ("README.txt", None),
]


def test_metadata_folder_names():
    for folder, expected in FOLDERS:
        assert metadata_folder_name(folder) == expected, folder


def test_normalized_names():
    # PEP 503: runs of '-', '_' and '.' become one separator; lower case.
    assert normalized("Flash-Attn") == "flash_attn"
    assert normalized("transformer.engine") == "transformer_engine"
    assert normalized("a-_.b") == "a_b"
