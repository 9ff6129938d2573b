"""Every study's claims table quotes its seed exactly: each claim with source "seed" has words found verbatim
in the seeds' texts (KVTB_PAPERS, default /work/shared/papers; whitespace collapsed, hyphenated line breaks
joined); keys are unique; the profiles a claim names exist in deploy/profiles/."""
from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

PAPERS = Path(os.environ.get("KVTB_PAPERS", "/work/shared/papers"))
PROFILES = Path(__file__).resolve().parents[3] / "deploy" / "profiles"
STUDIES = ("poster", "scalellm", "scalellm_replicas", "paper", "paper_causes", "eviction")


def normalized(text: str, keep_hyphen: bool = False) -> str:
    """Hyphenated line breaks joined ('trig-\\ngered' -> 'triggered'; with keep_hyphen, a compound split at
    its hyphen: 'CPU-\\ncentric' -> 'CPU-centric'), then every run of whitespace one space."""
    joined = re.sub(r"(\w)-\s*\n\s*(\w)", r"\1-\2" if keep_hyphen else r"\1\2", text)
    return re.sub(r"\s+", " ", joined).strip()


def study(name: str):
    """The study module; every study declares its claims table and names its seed."""
    module = importlib.import_module(f"bench.study.{name}")
    missing = [n for n in ("CLAIMS", "SEED") if not hasattr(module, n)]
    if missing:
        raise AssertionError(f"bench.study.{name} does not expose {' and '.join(missing)}")
    return module


def test_normalized_joins_hyphenated_breaks_and_collapses_whitespace():
    assert normalized("trig-\n  gered   ops\n\ton") == "triggered ops on"
    assert normalized("CPU-centric path") == "CPU-centric path"  # a hyphen inside a line stays
    assert normalized("CPU-\ncentric", keep_hyphen=True) == "CPU-centric"


@pytest.mark.parametrize("name", STUDIES)
def test_seed_words_are_the_seeds_exact_words(name):
    module = study(name)
    path = PAPERS / module.SEED
    if not PAPERS.is_dir():
        pytest.skip(f"{PAPERS} is absent (a fresh clone elsewhere): the seeds' texts are not here to check")
    assert path.is_file(), f"{name}.SEED names {module.SEED!r}, not a file in {PAPERS}"
    raw = path.read_text(encoding="utf-8")
    texts = (normalized(raw), normalized(raw, keep_hyphen=True))
    misquoted = [f"{c.key} ({c.figure}): {c.words!r}" for c in module.CLAIMS
                 if c.source == "seed" and not any(normalized(c.words) in t for t in texts)]
    assert not misquoted, f"{name}: not the seed's exact words:\n" + "\n".join(misquoted)


@pytest.mark.parametrize("name", STUDIES)
def test_claim_keys_are_unique(name):
    keys = [c.key for c in study(name).CLAIMS]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


@pytest.mark.parametrize("name", STUDIES)
def test_named_profiles_exist(name):
    known = {p.stem for p in PROFILES.glob("*.yaml")}
    assert known, f"no profiles in {PROFILES}"
    unknown = [f"{c.key}: {p}" for c in study(name).CLAIMS for p in (c.profiles or ()) if p and p not in known]
    assert not unknown, f"{name}: profiles not in deploy/profiles: {unknown}"
