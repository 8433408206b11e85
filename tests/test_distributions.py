"""core/distributions.py reads metadata folder names without ``re`` (start-up): the same
answers as the regular expression they replace, on real names and on random ones."""

from __future__ import annotations

import random
import re

from megatron_estimator.core.distributions import metadata_folder_name, normalized

# NAME[-VERSION[-REST]].dist-info / .egg-info, as importlib.metadata's folders are named.
META = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._]*?)(?:-(?P<version>[^-]+?)(?:-[^/]*)?)?"
                  r"\.(?P<kind>dist-info|egg-info)\Z", re.I)

REAL = ["torch-2.13.0.dist-info", "flash_attn-2.7.4.post1.dist-info", "megatron_core-0.16.1.dist-info",
        "transformer_engine-2.9.0-py3.11.egg-info", "Foo.EGG-INFO", "x-.dist-info", "x--1.dist-info",
        "-x.dist-info", ".dist-info", "a-1-.dist-info", "a-1-/x.dist-info", "a-1/x.dist-info", "pip-24.0.dist-info",
        "README.txt", "flash-attn-2.7.4.dist-info"]


def expected(name: str):
    m = META.match(name)
    return (m.group("name"), m.group("kind").lower()) if m else None


def test_real_folder_names():
    assert metadata_folder_name("torch-2.13.0.dist-info") == ("torch", "dist-info")
    assert metadata_folder_name("transformer_engine-2.9.0-py3.11.egg-info") == ("transformer_engine", "egg-info")
    assert metadata_folder_name("x-.dist-info") is None
    for name in REAL:
        assert metadata_folder_name(name) == expected(name), name


def test_random_folder_names_agree_with_the_regular_expression():
    rng = random.Random(14)
    alphabet = "aZ9._-/\u00e9DIST-INFOegg"
    for _ in range(20000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        name += rng.choice([".dist-info", ".egg-info", ".DIST-INFO", "-info", ""])
        assert metadata_folder_name(name) == expected(name), name
        assert normalized(name) == re.sub(r"[-_.]+", "_", name).lower(), name
