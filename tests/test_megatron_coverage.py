"""The estimator against Megatron-LM on coverage-generated cases (scripts/megatron_coverage).

tests/data/megatron_coverage_<label>.json.gz records cases made for coverage of Megatron's raise
sites, not from the estimator's rules: a CI command line (tests/data/megatron-ci-dev.tsv.gz) with
one to three of Megatron's parser flags set to random type-valid values, or mutated in the flags a
not-yet-reached check reads; and, for each, Megatron's own outcome (parse, validate_args, the
config classes' __post_init__ including the DDP and optimizer configs, the meta-device model build,
the first step's MoE check) on CPU at the recorded commit.  No Megatron is needed here.

Regenerate (about 15 minutes on 2 cores):
    python scripts/megatron_coverage --repo MEGATRON_LM_GIT --commit d98e8a64 --label main --cases 1600
Print the matrix, the coverage and every disagreement:
    PYTHONPATH=. python tests/test_megatron_coverage.py

tests/data/megatron_coverage_known.json: every disagreement, with Megatron's reason; those whose
value begins "rules29:" are rule classes of issue 29 being fixed in megatron_estimator/config/
and are expected to leave the list after that merge.  A new disagreement fails, and so does a
listed one that now agrees (take it off the list).
"""
import gzip
import json
from pathlib import Path

from test_megatron_parity import estimator_refuses

DATA = Path(__file__).parent / "data"
KNOWN = DATA / "megatron_coverage_known.json"


def records():
    return {p.name[len("megatron_coverage_"):-len(".json.gz")]: json.loads(gzip.open(p, "rt").read())
            for p in sorted(DATA.glob("megatron_coverage_*.json.gz"))}


def argv_of(record, case):
    """The base CI row's argv with the case's flags set (as scripts/megatron_coverage apply)."""
    out = list(record["bases"][case["base"]]["argv"])
    for option, value in case["set"]:
        values = [] if value is None else value.split(" ")
        if option in out:
            i = j = out.index(option)
            j += 1
            while j < len(out) and not out[j].startswith("--"):
                j += 1
            out[i:j] = [option, *values]
        else:
            out += [option, *values]
    return out


def matrix(label, record):
    counts, disagreements = {}, {}
    for n, case in enumerate(record["cases"]):
        if case["outcome"] == "timeout" or "not compiled with CUDA" in case["error"]:
            continue
        base = record["bases"][case["base"]]
        mine = "refuse" if estimator_refuses({**base, "argv": argv_of(record, case)}) else "accept"
        counts[(case["outcome"], mine)] = counts.get((case["outcome"], mine), 0) + 1
        if case["outcome"] != mine:
            disagreements[f"{label}#{n}"] = (f"megatron {case['outcome']} ({case['stage']}): {case['error']} "
                                             f"| set {case['set']}")
    return counts, disagreements


def coverage(record):
    sites = record["sites"]
    both = sum(s["accept"] is not None and s["refuse"] is not None for s in sites)
    return both, len(sites)


def test_the_estimator_agrees_on_generated_cases_or_the_disagreement_is_known():
    known = json.loads(KNOWN.read_text())
    found = {}
    for label, record in records().items():
        found.update(matrix(label, record)[1])
    assert sorted(set(found) - set(known)) == []
    assert sorted(set(known) - set(found)) == []     # a fixed disagreement leaves the list


def test_the_record_reaches_megatrons_raise_sites_both_ways():
    # the coverage the last generation reached, and that each site's example cases exist
    for label, record in records().items():
        assert record["sites"] and len(record["cases"]) >= 1500, label
        for site in record["sites"]:
            for way in ("accept", "refuse"):
                n = site[way]
                if n is not None:
                    case = record["cases"][n]
                    # a refusing example was refused at the site's file (its lines: the recorder)
                    assert way == "accept" or (case["outcome"] == "refuse" and case.get(
                        "where", "").startswith(site["site"].rsplit(":", 1)[0] + ":")), site


if __name__ == "__main__":
    known = json.loads(KNOWN.read_text()) if KNOWN.exists() else {}
    for label, record in records().items():
        counts, disagreements = matrix(label, record)
        both, total = coverage(record)
        print(f"{label} ({record['megatron_commit']}): {len(record['cases'])} cases; raise sites reached "
              f"both ways {both}/{total} ({100 * both / total:.1f}%)")
        for (megatron, mine), n in sorted(counts.items()):
            print(f"  megatron {megatron:6} estimator {mine:6} {n}")
        for name, why in sorted(disagreements.items(), key=lambda kv: int(kv[0].split("#")[1])):
            print(f"  {name}: {why}" + (f"  [{known[name]}]" if name in known else "  [NEW]"))
