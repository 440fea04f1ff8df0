"""Fixtures are deterministic and loadable; the reference loop; prompts; the CLI."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from kolibri_trt import KolibriBlockDrafter, KolibriForCausalLM
from kolibri_trt.cli import main
from kolibri_trt.fixtures import make_fixtures, random_target
from kolibri_trt.prompts import load_prompts
from kolibri_trt.reference_generate import reference_generate
from kolibri_trt.sampling import SamplingParams

from model_configs import SHARED, micro_target_config


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_fixtures_are_byte_identical_and_load(tmp_path):
    a, _ = make_fixtures(tmp_path / "a", seed=3, with_tokenizer=False)
    make_fixtures(tmp_path / "b", seed=3, with_tokenizer=False)
    for sub in ("target", "drafter"):
        assert _digest(tmp_path / "a" / sub) == _digest(tmp_path / "b" / sub)
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 10 and cfg["layer_types"][4] == "full_attention"
    assert cfg["head_dim"] == 128 and cfg["vocab_size"] == 131072
    target = KolibriForCausalLM.from_pretrained(a)
    drafter = KolibriBlockDrafter.from_pretrained(tmp_path / "a" / "drafter", target=target)
    assert drafter.config.target_layer_ids == (5, 8, 9)
    with pytest.raises(FileExistsError, match="force"):
        make_fixtures(tmp_path / "a", seed=3, with_tokenizer=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_reference_loop_greedy_equals_argmax_chain_and_stops():
    model = random_target(micro_target_config(), seed=2, dtype=torch.float32)
    prompt = [5, 17, 300, 42]
    out = reference_generate(model, prompt, SamplingParams(max_tokens=6))
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out.token_ids == ids[len(prompt):] and out.finish_reason == "length"
    stop_at = out.token_ids[2]
    stopped = reference_generate(model, prompt, SamplingParams(max_tokens=6, stop_token_ids=[stop_at]))
    assert stopped.token_ids == out.token_ids[:out.token_ids.index(stop_at) + 1]
    assert stopped.finish_reason == "stop"


def test_reference_loop_sampling_is_seeded():
    model = random_target(micro_target_config(), seed=2, dtype=torch.float32)
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=9, ignore_eos=True)
    a, b = reference_generate(model, [1, 2, 3], p), reference_generate(model, [1, 2, 3], p)
    c = reference_generate(model, [1, 2, 3], SamplingParams(max_tokens=8, temperature=1.0, seed=10))
    assert a == b and a.token_ids != c.token_ids
    with pytest.raises(ValueError, match="prompt_ids"):
        reference_generate(model, [], p)
    with pytest.raises(ValueError, match="prompt_ids"):
        reference_generate(model, [512], p)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/ prompt sets not beside the checkout")
def test_prompt_sets_load_by_category():
    spec = load_prompts(SHARED / "data/prompts/spec_bench_question.jsonl", per_category=1)
    assert [p.category for p in spec] == ["mt_bench", "translation", "summarization", "qa",
                                          "math_reasoning", "rag"]
    assert "Übersetze" in spec[1].text or "German" in spec[1].text
    he = load_prompts(SHARED / "data/prompts/human_eval.jsonl.gz", limit=3)
    assert len(he) == 3 and he[0].category == "humaneval" and "def " in he[0].text


def test_prompt_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_prompts(bad)
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "none.jsonl")


def test_cli_reference_generate_on_tiny_checkpoint(tmp_path, capsys):
    from kolibri_trt.tokenizer import write_tekken_tokenizer
    model = random_target(micro_target_config(vocab_size=131072, hidden_size=32,
                                              num_hidden_layers=1, layer_types=("sliding_attention",)),
                          seed=1)
    model.save_pretrained(tmp_path / "m")
    write_tekken_tokenizer(tmp_path / "m")
    assert main(["reference-generate", "--model", str(tmp_path / "m"), "--prompt",
                 "Grüß Gott!", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 tokens, finish_reason=length" in out and "tokens/s" in out
    assert main(["reference-generate", "--model", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err
