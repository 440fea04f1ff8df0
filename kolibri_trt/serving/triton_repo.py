"""Triton Inference Server model repository for a kolibri-trt engine; the request logic of
its Python-backend model (`triton_model.py`, copied as `1/model.py`) is `triton_frontend.py`.

    <repo>/kolibri/config.pbtxt   Python backend, decoupled; parameters: engine_dir,
                                  speculative, max_num_seqs, max_model_len, kv_cache_memory,
                                  max_waiting
    <repo>/kolibri/1/model.py     the thin model: decode the request, submit it to the
                                  instance's EngineLoop, send each step as a response

Tensor names are those of TensorRT-LLM's `ensemble` model, so its clients work unchanged:
inputs `text_input` (BYTES), `max_tokens` (INT32), optional `temperature`, `top_p` (FP32),
`top_k` (INT32), `random_seed` (UINT64), `stop_words` (BYTES list), `stream` (BOOL),
`bad_words` (BYTES, only empty accepted), `end_id` (INT32: replaces EOS as the stop token),
`pad_id` (INT32, ignored); plus `speculative` (BYTES: a request may name the served mode).
Outputs: `text_output` (BYTES: the generated text only, or with stream=true each delta),
`finish_reason` (BYTES: "stop" | "length", empty until the final response), and the
speculative-decoding metrics of the request so far, in TensorRT-LLM's names where it has them:
`acceptance_rate` (FP32), `total_accepted_draft_tokens`, `total_draft_tokens` (INT32),
`acceptance_length` (FP32, tokens per target pass).

Everything here runs without a Triton server, so it is unit-tested directly; only
`triton_model.py` imports `triton_python_backend_utils`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from ..spec.speculator import MODES as SPECULATIVE_MODES

MODEL_NAME = "kolibri"
MODEL_FILE = Path(__file__).with_name("triton_model.py")

# (name, Triton data type, dims without the batch dimension); all declared optional so that a
# missing required input gets this model's own error message (naming the input).
INPUTS = (
    ("text_input", "TYPE_STRING", "[ 1 ]"),
    ("max_tokens", "TYPE_INT32", "[ 1 ]"),
    ("temperature", "TYPE_FP32", "[ 1 ]"),
    ("top_p", "TYPE_FP32", "[ 1 ]"),
    ("top_k", "TYPE_INT32", "[ 1 ]"),
    ("random_seed", "TYPE_UINT64", "[ 1 ]"),
    ("stop_words", "TYPE_STRING", "[ -1 ]"),
    ("bad_words", "TYPE_STRING", "[ -1 ]"),
    ("end_id", "TYPE_INT32", "[ 1 ]"),
    ("pad_id", "TYPE_INT32", "[ 1 ]"),
    ("stream", "TYPE_BOOL", "[ 1 ]"),
    ("speculative", "TYPE_STRING", "[ 1 ]"),
)
OUTPUTS = (
    ("text_output", "TYPE_STRING", "[ -1 ]"),
    ("finish_reason", "TYPE_STRING", "[ 1 ]"),
    ("acceptance_rate", "TYPE_FP32", "[ 1 ]"),
    ("total_accepted_draft_tokens", "TYPE_INT32", "[ 1 ]"),
    ("total_draft_tokens", "TYPE_INT32", "[ 1 ]"),
    ("acceptance_length", "TYPE_FP32", "[ 1 ]"),
)


# ---- model options (config.pbtxt parameters) -------------------------------------------------
@dataclass(frozen=True)
class ModelOptions:
    """What one model instance serves. engine_dir: folder written by build.py; speculative:
    one of "off", "copy", "drafter", "copy+drafter"; max_num_seqs: streams decoded together
    (the continuous batch); max_waiting: requests queued beyond it before new ones get
    UNAVAILABLE; max_model_len, kv_cache_memory (bytes): see EngineArgs."""

    engine_dir: Path
    speculative: str = "copy+drafter"
    max_num_seqs: int = 8
    max_model_len: int = 4096
    kv_cache_memory: int = 1 << 30
    max_waiting: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine_dir", Path(self.engine_dir))
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative: unknown mode {self.speculative!r}; one of "
                             f"{list(SPECULATIVE_MODES)}")
        for name in ("max_num_seqs", "max_model_len", "kv_cache_memory", "max_waiting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")

    @classmethod
    def from_model_config(cls, config: dict) -> ModelOptions:
        """From the model configuration Triton hands to `initialize` (parsed JSON).

        Raises:
            ValueError: a missing engine_dir, an unknown parameter or mode, a bad number.
        """
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"config.pbtxt parameters: unknown {unknown}; known {sorted(known)}")
        if not params.get("engine_dir"):
            raise ValueError("config.pbtxt parameters: engine_dir is missing")
        kwargs: dict = {}
        for key, text in params.items():
            if key in ("engine_dir", "speculative"):
                kwargs[key] = text
            else:
                try:
                    kwargs[key] = int(text)
                except ValueError:
                    raise ValueError(f"{key}: must be a positive int, got {text!r}") from None
        return cls(**kwargs)

    def parameters(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}


def config_pbtxt(options: ModelOptions, model_name: str = MODEL_NAME, instances: int = 1) -> str:
    """The model configuration: Python backend, decoupled, batch 1 per request (the engine
    batches requests itself), `instances` CPU instances each with its own engine."""
    def tensor(name: str, dtype: str, dims: str, optional: bool) -> str:
        opt = " optional: true" if optional else ""
        return f"  {{ name: \"{name}\" data_type: {dtype} dims: {dims}{opt} }}"

    def string(value: str) -> str:
        return json.dumps(value)  # a protobuf text string: JSON's escaping is valid there

    inputs = ",\n".join(tensor(n, t, d, True) for n, t, d in INPUTS)
    outputs = ",\n".join(tensor(n, t, d, False) for n, t, d in OUTPUTS)
    params = "\n".join(f"parameters {{ key: {string(k)} value: {{ string_value: {string(v)} }} }}"
                       for k, v in options.parameters().items())
    return (f"# written by kolibri-trt (kolibri_trt/serving/triton_repo.py)\n"
            f"name: {string(model_name)}\nbackend: \"python\"\nmax_batch_size: 1\n"
            f"model_transaction_policy {{ decoupled: true }}\n"
            f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{params}\n")


def write_model_repository(out: str | Path, options: ModelOptions, model_name: str = MODEL_NAME,
                           instances: int = 1, force: bool = False) -> Path:
    """Write `<out>/<model_name>/{config.pbtxt, 1/model.py}`; the engine path is stored
    absolute. Written beside `out` and renamed, so no half-written repository is left.

    Raises:
        FileNotFoundError: engine_dir has no manifest.json.
        FileExistsError: `out` exists and `force` is not set.
        ValueError: a bad model name or instance count.
    """
    out = Path(out)
    engine = options.engine_dir.resolve()
    if not (engine / "manifest.json").is_file():
        raise FileNotFoundError(f"{engine / 'manifest.json'}: not an engine folder written by "
                                "build.py")
    if not model_name or not all(c.isalnum() or c in "-_." for c in model_name):
        raise ValueError(f"model_name: letters, digits, '-', '_', '.' only, got {model_name!r}")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances: must be a positive int, got {instances!r}")
    if out.exists() and not force:
        raise FileExistsError(f"output folder {out} exists; pass --force to replace it")
    options = ModelOptions(**{**options.__dict__, "engine_dir": engine})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model = tmp / model_name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config_pbtxt(options, model_name, instances),
                                            encoding="utf-8")
        shutil.copyfile(MODEL_FILE, model / "1" / "model.py")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
