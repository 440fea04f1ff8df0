"""The CPU-side training tools (`tools/`): corpus cleaning, tokenizer training, the fast
training forward passes against the references, exact resume, checkpoints that load."""

from __future__ import annotations

import json
import lzma
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import corpus  # noqa: E402
import corpus_clean as cc  # noqa: E402
import fast_drafter  # noqa: E402
import fast_target  # noqa: E402
import train_common  # noqa: E402
import train_drafter  # noqa: E402
import train_target  # noqa: E402
import train_tokenizer  # noqa: E402
from eval_acceptance import acceptance  # noqa: E402

from kolibri_trt.drafter import KolibriBlockDrafter  # noqa: E402
from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config  # noqa: E402
from kolibri_trt.model.reference import KolibriForCausalLM  # noqa: E402
from kolibri_trt.tokenizer import KolibriTokenizer  # noqa: E402
from model_configs import micro_target_config  # noqa: E402

LOSS_RTOL = 1e-5        # fast vs reference loss, fp32 (measured ~1e-7)
GRAD_RTOL = 1e-4        # fast vs reference gradients, fp32, relative to the largest entry
LOGIT_ATOL = 1e-4       # fast vs reference drafter logits, fp32
TINY_VOCAB = 400

EN = "the model reads a window of text and the drafter proposes four tokens at once".split()
DE = "der Entwurf wird geprüft und die Antwort ist für alle Leser dieser Seite gleich".split()
CODE = "def f(x):\n    return x + 1\n\nclass A:\n    pass\n"


def _docs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lang = ("en", "de", "code")[i % 3]
        if lang == "code":
            text = CODE * rng.randint(2, 4)
        else:
            words = EN if lang == "en" else DE
            text = "\n\n".join(" ".join(rng.choice(words) for _ in range(30)) for _ in range(3))
        out.append({"lang": lang, "source": "test", "text": text})
    return out


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """corpus/{train,valid}.jsonl.xz and corpus/tokenizer (a BPE of TINY_VOCAB ids)."""
    d = tmp_path_factory.mktemp("corpus")
    corpus.write_jsonl_xz(d / "train.jsonl.xz", _docs(30, 0))
    corpus.write_jsonl_xz(d / "valid.jsonl.xz", _docs(6, 1))
    texts = [x["text"] for x in corpus.iter_corpus(d / "train.jsonl.xz")]
    tok = train_tokenizer.train_bpe(texts, TINY_VOCAB, train_tokenizer.control_tokens(), False)
    train_tokenizer.write_tokenizer(tok, d / "tokenizer")
    return d


# ---- corpus cleaning ----------------------------------------------------------------------
def test_html_to_text_keeps_blocks_and_drops_scripts():
    html = ("<html><head><title>T</title><style>p{}</style></head><body><h1>Kopf</h1>"
            "<p>Ein  Absatz\nmit <b>fett</b>&amp;mehr.</p><script>x()</script>"
            "<pre>  a = 1\n  b = 2</pre><ul><li>eins</li><li>zwei</li></ul></body></html>")
    assert cc.html_to_text(html) == \
        "Kopf\n\nEin Absatz mit fett&mehr.\n\n  a = 1\n  b = 2\n\neins\n\nzwei"


def test_shingles_ignore_number_runs():
    assert cc.word_shingles(" ".join(str(i) for i in range(30))) == set()
    assert len(cc.word_shingles(" ".join(f"w{i}" for i in range(15)))) == 3


def test_normalize_language_and_dedupe():
    assert cc.normalize_text("a \r\n\n\n\nb\x00\t \n") == "a\n\nb"
    assert cc.normalize_text("a\n\n\n\n\nb", max_blank_lines=2) == "a\n\n\nb"
    de = "Die Datei wird nicht gelesen, wenn der Pfad mit dem Namen nicht auf die Seite zeigt " * 2
    en = "The file is not read if the path with the name does not point to the page and " * 2
    assert cc.guess_language(de) == "de" and cc.guess_language(en) == "en"
    assert cc.guess_language("x = 1\ny = 2") is None
    seen: set[bytes] = set()
    para = "This paragraph is long enough to be de-duplicated everywhere."
    assert cc.dedupe_paragraphs(f"Title\n{para}", seen) == f"Title\n{para}"
    assert cc.dedupe_paragraphs(f"Title\n{para.upper()}\nnew", seen) == "Title\nnew"


def test_lyx_man_and_python_cleaning():
    lyx = ("\\lyxformat 544\n\\begin_body\n\\begin_layout Standard\nErste \nZeile\n"
           "\\begin_inset Formula $x$\n\\end_inset\n\n\\end_layout\n\\begin_layout Standard\n"
           "Zweite\n\\end_layout\n\\end_body\n")
    assert cc.lyx_to_text(lyx) == "Erste Zeile\n\nZweite"
    render = ("LS(1)          User Commands          LS(1)\n\nNAME\n       ls - list\n\n"
              "GNU                 2023                 LS(1)\n")
    assert cc.clean_man_render(render) == "NAME\nls - list"
    assert cc.man_to_text(b".so man1/other.1\n") == ""
    if shutil.which("groff"):
        text = cc.man_to_text(b".TH X 1\n.SH NAME\nx \\- tut etwas\n.SH BESCHREIBUNG\n"
                              b"Ein \\fBfetter\\fR Satz.\n")
        assert "x - tut etwas" in text and "Ein fetter Satz." in text
    assert cc.python_source_ok("def f():\n    return 1\n")
    assert not cc.python_source_ok("x = '" + "a" * 1000 + "'\n")
    assert not cc.python_source_ok("# Generated by protoc. DO NOT EDIT!\nx = 1\n")


def test_collector_caps_dedupes_and_drops_evaluation_text(tmp_path):
    src = corpus.Source("s", "en", "text", ("*",), "MIT", 1.0, root=str(tmp_path))
    prompt = ("Translate the following sentence from German into English, please: Der alte "
              "Hund schläft heute den ganzen Tag im Garten.")
    col = corpus.Collector({"en": 2000, "de": 2000, "code": 10}, cc.word_shingles(prompt))
    body = " ".join(["the file is read and the result of this step is written to it"] * 5)
    assert col.add(src, body) > 0
    assert col.add(src, body) == 0                                     # duplicate
    assert col.add(src, body.replace("file", "page") + " " + prompt) == 0  # contaminated
    assert col.add(src, body.replace("file", "disk") * 8) == 0          # over the cap
    assert set(col.dropped) == {"duplicate document", "overlaps evaluation prompts",
                                "over the en cap"}
    train, valid = corpus.split_docs(col.docs, 0.1, 0)
    assert len(train) + len(valid) == 1 and len(valid) == 0  # one document stays in train


# ---- tokenizer ----------------------------------------------------------------------------
def test_trained_tokenizer_loads_with_tekken_control_ids(tiny_corpus):
    from kolibri_trt.tokenizer import tekken_source_path
    pattern = json.loads(tekken_source_path().read_text())["config"]["pattern"]
    assert train_tokenizer.TEKKEN_PATTERN == pattern
    tok = KolibriTokenizer.from_pretrained(tiny_corpus / "tokenizer")
    assert tok.vocab_size == TINY_VOCAB
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 11)
    assert tok.token_to_id("[INST]") == 3 and tok.token_to_id("[SYSTEM_PROMPT]") == 17
    ids = tok.apply_chat_template([{"role": "user", "content": "Grüß Gott"}])
    assert ids[:2] == [1, 3] and ids[-1] == 4
    text = "Grüß Gott! def f(x):\n    return [INST] x"
    assert tok.decode(tok.encode(text)) == text


# ---- target -------------------------------------------------------------------------------
def test_fast_target_matches_reference_loss_and_gradients():
    model = random_target(micro_target_config(), seed=3, dtype=torch.float32).requires_grad_(True)
    ids = torch.randint(0, 512, (2, 13), generator=torch.Generator().manual_seed(0))
    inp, tgt = ids[:, :-1], ids[:, 1:]
    ref = torch.nn.functional.cross_entropy(model(inp).reshape(-1, 512), tgt.reshape(-1))
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    fast = fast_target.lm_loss(model, inp, tgt)
    fast_grads = torch.autograd.grad(fast, list(model.parameters()))
    assert abs(float(fast.detach()) - float(ref.detach())) <= LOSS_RTOL * float(ref.detach())
    for (name, _), a, b in zip(model.named_parameters(), fast_grads, ref_grads):
        scale = float(b.abs().max()) or 1.0
        assert float((a - b).abs().max()) <= GRAD_RTOL * scale, name


TARGET_ARGS = ["--layers", "5", "--hidden", "32", "--heads", "2", "--kv-heads", "1",
               "--head-dim", "16", "--experts", "4", "--moe-intermediate", "8",
               "--shared-intermediate", "8", "--sliding-window", "7", "--seq-len", "16",
               "--batch-size", "2", "--steps", "4", "--warmup", "2", "--save-every", "100",
               "--log-every", "1", "--eval-every", "100", "--eval-batches", "1",
               "--device", "cpu", "--chat-fraction", "0.5"]


def _target_run(tiny_corpus, run: Path, *extra: str) -> dict:
    args = train_target.build_parser().parse_args(
        ["--corpus", str(tiny_corpus), "--run-dir", str(run), "--cache-dir",
         str(tiny_corpus / "cache"), *TARGET_ARGS, *extra])
    return train_target.train(args)


def _state_tensors(run: Path) -> dict:
    from safetensors.torch import load_file
    out = {}
    for name in ("model", "optimizer"):
        out.update({f"{name}/{k}": v for k, v in
                    load_file(run / "state" / f"{name}.safetensors").items()})
    return out


@pytest.fixture(scope="module")
def trained_target(tiny_corpus, tmp_path_factory) -> Path:
    """A run of 4 steps in one call; its export folder."""
    run = tmp_path_factory.mktemp("target_full")
    meta = _target_run(tiny_corpus, run)
    assert meta["step"] == 4 and meta["valid_loss"] == meta["valid_loss"]  # finite
    return run


def test_target_resume_is_bit_exact_and_exports_a_checkpoint(tiny_corpus, trained_target,
                                                             tmp_path):
    run = tmp_path / "resumed"
    assert _target_run(tiny_corpus, run, "--max-steps-this-call", "2")["step"] == 2
    assert not (run / "export").exists()                 # not done: no export yet
    assert _target_run(tiny_corpus, run)["step"] == 4
    a, b = _state_tensors(trained_target), _state_tensors(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    model = KolibriForCausalLM.from_pretrained(trained_target / "export")
    assert model.config.extra["training_steps"] == 4
    assert KolibriTokenizer.from_pretrained(trained_target / "export").vocab_size == \
        model.config.vocab_size
    losses = [json.loads(x)["loss"] for x in (trained_target / "log.jsonl").read_text()
              .splitlines() if '"loss"' in x]
    assert len(losses) == 4 and all(x == x and x < 20 for x in losses)


# ---- drafter ------------------------------------------------------------------------------
def test_fast_drafter_matches_reference_block_pass():
    target = random_target(micro_target_config(), seed=5, dtype=torch.float32)
    cfg = tiny_drafter_config(target.config, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, intermediate_size=48, predecessor_rank=8,
                              spine_rank=8, draft_vocab_size=200, context_window=6)
    drafter = random_drafter(cfg, target, seed=6, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    taps = torch.randn(1, 11, cfg.num_taps, cfg.hidden_size, generator=gen)
    nxt = torch.randint(0, 512, (1, 11), generator=gen)
    logits, drafts = fast_drafter.block_logits(
        drafter, fast_drafter.block_states(drafter, taps, nxt), None)
    for p in (0, 3, 10):
        ref_ids, ref_logits = drafter.propose(taps[0, :p + 1], nxt[0, :p + 1])
        assert torch.equal(drafts[0, p], ref_ids)
        assert torch.allclose(logits[0, p].float(), ref_logits, atol=LOGIT_ATOL)


def test_distill_loss_is_zero_on_the_teacher():
    teacher = torch.randn(2, 6, 10)
    student = torch.stack([torch.roll(teacher, -1 - j, dims=1) for j in range(3)], dim=2)
    loss, agree, none = train_drafter.distill_loss(student, teacher, 0.8)
    assert float(loss) < 1e-6 and all(float(a) == 1.0 for a in agree) and none == []
    w = torch.rand(2, 6) + 0.5
    miss = torch.rand(2, 6) < 0.5
    loss, agree, agree_miss = train_drafter.distill_loss(student, teacher, 0.8, w, miss)
    assert float(loss) < 1e-6 and len(agree_miss) == 3


def test_distill_loss_weights_the_anchors():
    """Anchor weights: a weighted loss is the weighted mean of the per-anchor KL (row 0 only:
    a block of 1), so all the weight on one anchor gives that anchor's KL."""
    teacher, student = torch.randn(1, 5, 7), torch.randn(1, 5, 1, 7)
    w = torch.zeros(1, 5)
    w[0, 2] = 3.0
    loss, _, _ = train_drafter.distill_loss(student, teacher, 0.8, w)
    logp_t = torch.log_softmax(teacher[0, 3], -1)
    want = (logp_t.exp() * (logp_t - torch.log_softmax(student[0, 2, 0], -1))).sum()
    assert float(loss) == pytest.approx(float(want), rel=1e-5)


def test_copy_miss_mask_matches_the_copy_index():
    """copy_miss_mask marks exactly the anchors where `CopyIndex` (n-grams 2..4) proposes
    nothing after the window's tokens up to the anchor's next token."""
    from kolibri_trt.spec.copy_proposer import CopyIndex
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (3, 41), generator=g)      # a small alphabet: many repeats
    mask = train_drafter.copy_miss_mask(ids)
    assert mask.shape == (3, 40)
    for b in range(3):
        for p in range(40):
            index = CopyIndex(2, 4)
            index.extend(ids[b, :p + 2].tolist())
            assert bool(mask[b, p]) == (index.propose(1) == []), (b, p)
    assert 0 < int(mask.sum()) < mask.numel()


def test_drafter_trains_two_steps_and_its_checkpoint_loads(tiny_corpus, trained_target, tmp_path):
    args = train_drafter.build_parser().parse_args([
        "--corpus", str(tiny_corpus), "--target", str(trained_target / "export"),
        "--run-dir", str(tmp_path / "drafter"), "--cache-dir", str(tiny_corpus / "cache"),
        "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--intermediate", "16", "--rank", "4", "--draft-vocab-size", "64",
        "--vocab-tokens", "64", "--seq-len", "12", "--batch-size", "2", "--steps", "2",
        "--warmup", "1", "--log-every", "1", "--eval-batches", "1", "--device", "cpu"])
    meta = train_drafter.train(args)
    assert meta["step"] == 2 and [len(v) for v in meta["valid_agree"].values()] == [4, 4]
    target = KolibriForCausalLM.from_pretrained(trained_target / "export")
    drafter = KolibriBlockDrafter.from_pretrained(tmp_path / "drafter" / "export", target=target)
    assert drafter.config.target_layer_ids == (0, 2, 4)
    assert len(drafter.draft_vocab) == 64 and 2 in drafter.draft_vocab.tolist()
    # fine-tuning from that export, the anchors where copy drafting misses weighted 3x
    # (and half of each batch from a self-distillation stream, `--generated`)
    tuned, gen = tmp_path / "tuned", tmp_path / "gen.npy"
    np.save(gen, (np.arange(600) * 7 % TINY_VOCAB).astype(np.uint16))
    args = train_drafter.build_parser().parse_args([
        "--corpus", str(tiny_corpus), "--target", str(trained_target / "export"),
        "--run-dir", str(tuned), "--cache-dir", str(tiny_corpus / "cache"),
        "--init-from", str(tmp_path / "drafter" / "export"), "--copy-miss-weight", "2",
        "--generated", str(gen), "--generated-fraction", "0.5",
        "--seq-len", "12", "--batch-size", "2", "--steps", "1", "--warmup", "1",
        "--log-every", "1", "--eval-batches", "1", "--device", "cpu"])
    meta = train_drafter.train(args)
    assert meta["step"] == 1 and len(meta["valid_gen_agree"]["all"]) == 4
    again = KolibriBlockDrafter.from_pretrained(tuned / "export", target=target)
    assert again.draft_vocab.tolist() == drafter.draft_vocab.tolist()
    extra = again.config.extra
    assert (extra["training_steps"], extra["fine_tuning_steps"]) == (3, 1)
    assert extra["copy_miss_weight"] == 2.0 and extra["generated_fraction"] == 0.5
    changed = any(not torch.equal(a, b) for a, b in zip(drafter.state_dict().values(),
                                                         again.state_dict().values()))
    assert changed


# ---- small helpers ------------------------------------------------------------------------
def test_schedule_batches_and_acceptance_helpers(tmp_path):
    assert train_common.lr_at(0, 1.0, 10, 100, 0.1) == pytest.approx(0.1)
    assert train_common.lr_at(100, 1.0, 10, 100, 0.1) == pytest.approx(0.1)
    tokens = (torch.arange(1000) % 300).numpy().astype("uint16")
    assert torch.equal(train_common.batch_at(tokens, 7, 3, 9, 0),
                       train_common.batch_at(tokens, 7, 3, 9, 0))
    a = acceptance([[True, True, False, True], [False, True, True, True], [True, True]], 4)
    assert a["accepted_per_round_3"] == 1.0 and a["accepted_per_round_4"] == 1.0
    assert a["agreement"] == [0.667, 1.0, 0.5, 1.0]
    with lzma.open(tmp_path / "x.jsonl.xz", "wt") as f:
        f.write('{"lang": "en", "source": "s", "text": "t"}\n')
    assert list(corpus.iter_corpus(tmp_path / "x.jsonl.xz"))[0]["text"] == "t"


def test_trainers_import_without_packages_the_gpu_machine_lacks():
    """The GPU machine has no mistral-common and no installed kolibri_trt_plugins:
    `tools/gpu_env.py` must make the trainers importable anyway."""
    import subprocess
    code = (
        "import importlib.abc, sys\n"
        "BLOCK = {'mistral_common', 'kolibri_trt_plugins', 'modelopt', 'fastapi', 'pydantic'}\n"
        "class Blocker(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        top = name.split('.')[0]\n"
        "        if top in BLOCK and not (top == 'kolibri_trt_plugins' and name != top):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Blocker())\n"
        f"sys.path[:0] = [{str(ROOT / 'tools')!r}, {str(ROOT)!r}]\n"
        "import train_target, train_drafter\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
