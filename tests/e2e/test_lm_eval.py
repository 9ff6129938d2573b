"""lm-evaluation-harness's `local-completions` model against the real services' /v1/completions, 16
requests in flight on one key with the stock admission: one small generate_until task from a local
YAML and a local JSON-lines file (no dataset hub), scored by exact match; the frontend's metrics count
the requests it served and refused none."""
from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import USERS

pytestmark = [pytest.mark.service, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
TASK = "kvtb_capitals"
ITEMS = [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"),
         ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Greece", "Athens"), ("Russia", "Moscow"),
         ("China", "Beijing"), ("Austria", "Vienna"), ("Portugal", "Lisbon"), ("Norway", "Oslo"),
         ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
         ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Kenya", "Nairobi"), ("Peru", "Lima")]
NUM_CONCURRENT = 16  # lm-eval's requests in flight on one key: none may be refused (it ignores Retry-After)


def write_task(root) -> None:
    """The task's YAML and data under root (a TaskManager include path)."""
    data = root / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": country, "answer": city}) + "\n"
                            for country, city in ITEMS))
    (root / f"{TASK}.yaml").write_text(yaml.safe_dump({
        "task": TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "The capital of {{country}} is", "doc_to_target": "{{answer}}",
        # min_tokens (vLLM's, passed through by lm-eval): the instruct model may end its turn at once
        "generation_kwargs": {"until": ["\n", "."], "max_gen_toks": 8, "temperature": 0.0, "do_sample": False,
                              "min_tokens": 1},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": True, "ignore_punctuation": True}],
        "filter_list": [{"name": "strip", "filter": [{"function": "regex", "regex_pattern": r"\s*(\w+)"},
                                                     {"function": "take_first"}]}],
        "metadata": {"version": 1.0}}))


def frontend_counts(metrics_address: str) -> tuple[float, float]:
    """(turns the frontend finished, turns it refused as busy), all tenants, from its metrics port."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return (sum(s.value for s in samples if s.name == "kvtb:requests_total" and s.labels.get("status") == "ok"),
            sum(s.value for s in samples if s.name == "kvtb:requests_rejected_busy_total"))


def test_local_completions_runs_a_local_task(triggered, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    write_task(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", USERS["alice"])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    metrics = triggered.services["frontend"]["metrics"]
    served, refused = frontend_counts(metrics)
    base_url = f"http://{triggered.services['frontend']['http']}/v1/completions"
    results = simple_evaluate(
        model="local-completions",
        model_args={"model": MODEL, "base_url": base_url, "tokenizer_backend": None, "tokenized_requests": False,
                    "num_concurrent": NUM_CONCURRENT, "max_retries": 1},
        tasks=[TASK], task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        num_fewshot=0, log_samples=True)
    score = results["results"][TASK]["exact_match,strip"]
    assert 0.0 <= score <= 1.0
    samples = results["samples"][TASK]
    assert len(samples) == len(ITEMS) and any(s["resps"][0][0].strip() for s in samples)
    served_after, refused_after = frontend_counts(metrics)
    assert served_after - served >= len(ITEMS) and refused_after == refused
