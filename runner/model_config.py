"""The shape of your own model from its Hugging Face ``config.json`` (``--model-config PATH``).

meshtop plans and runs the shape of a real Llama-family decoder (``model_type``
llama or mistral, architectures ``LlamaForCausalLM`` / ``MistralForCausalLM``)
with random weights: the parameter count, memory, communication and compute
of each parallel plan depend on the shape alone, so no checkpoint is read.

Read, with Hugging Face's ``LlamaConfig`` defaults where a field may be left out:

- ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``intermediate_size``, ``vocab_size``: required positive integers;
- ``num_key_value_heads`` (default: the attention heads);
- ``tie_word_embeddings`` (default false): the output projection is the token
  embedding's matrix;
- ``rope_theta`` (default 10000; or ``rope_parameters.rope_theta``),
  ``rms_norm_eps`` (default 1e-6);
- ``max_position_embeddings`` (default 2048): the default sequence length is
  the smaller of it and 4096;
- ``_name_or_path``'s last part names the shape, else the folder of a
  ``config.json``, else the file's stem.

Refused, because the built-in model could not build it: ``head_dim`` other
than ``hidden_size / num_attention_heads`` (the built-in ties the head width
to them), an odd head width (rotary positions rotate pairs of channels), and
``attention_bias`` or ``mlp_bias`` true (the built-in has no biases).

Accepted and not applied: ``rope_scaling`` (it changes which angle a position
gets, not a shape or a cost; the built-in applies plain rotary positions),
Mistral's ``sliding_window`` (the built-in attends over the whole causal
prefix: the same cost up to the window's length), ``hidden_act`` (the built-in
is SwiGLU with SiLU, as every Llama and Mistral release), dropout and the
dtype (``--dtype`` decides).

Nothing here imports torch: a bad config is refused before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from meshtop.recordings.manifest import ModelShape
from meshtop.runner.errors import ModelConfigError

MODEL_TYPES = ("llama", "mistral")
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
LONGEST_DEFAULT_SEQ_LEN = 4096
"""The default ``--seq-len`` of a config whose ``max_position_embeddings`` is longer (Llama 3.2: 131072)."""
DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048}
"""Hugging Face ``LlamaConfig``'s defaults for the optional fields read."""
MAX_CONFIG_BYTES = 16 * 2**20
"""A config.json is a few kilobytes; a file this big is a checkpoint given by mistake."""


def load_model_config(path: str) -> ModelShape:
    """The :class:`ModelShape` of the Llama-family decoder that the ``config.json`` at ``path`` (or in the
    folder ``path``) describes; a one-line :class:`ModelConfigError` otherwise."""
    file = Path(path)
    if file.is_dir():
        if not (file / "config.json").is_file():
            raise ModelConfigError(
                f"--model-config {path} is a folder without a config.json: give the path of the model's config.json"
            )
        file = file / "config.json"
    config = _read_object(file)
    return shape_from_config(config, source=file)


def shape_from_config(config: dict[str, object], *, source: Path) -> ModelShape:
    """The shape of the decoder ``config`` (the fields of a config.json read from ``source``) describes."""
    where = f"--model-config {source}"
    _check_family(config, where)
    dim = _positive_int(config, "hidden_size", where)
    n_layers = _positive_int(config, "num_hidden_layers", where)
    n_heads = _positive_int(config, "num_attention_heads", where)
    ffn_dim = _positive_int(config, "intermediate_size", where)
    vocab_size = _positive_int(config, "vocab_size", where)
    n_kv_heads = _positive_int(config, "num_key_value_heads", where, default=n_heads)
    max_positions = _positive_int(
        config, "max_position_embeddings", where, default=int(DEFAULTS["max_position_embeddings"])
    )
    if dim % n_heads:
        raise ModelConfigError(
            f"{where}: hidden_size {dim} is not a multiple of num_attention_heads {n_heads}: "
            "the built-in model's heads are hidden_size / heads wide"
        )
    if n_heads % n_kv_heads:
        raise ModelConfigError(
            f"{where}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads "
            f"{n_kv_heads}: each key/value head must serve the same number of query heads"
        )
    head_dim = dim // n_heads
    given_head_dim = _positive_int(config, "head_dim", where, default=head_dim)
    if given_head_dim != head_dim:
        raise ModelConfigError(
            f"{where}: head_dim {given_head_dim} differs from hidden_size / num_attention_heads "
            f"= {head_dim}: the built-in model's heads are hidden_size / heads wide, so it "
            "cannot build this model"
        )
    if head_dim % 2:
        raise ModelConfigError(
            f"{where}: heads {head_dim} wide (hidden_size / num_attention_heads) are odd: "
            "rotary positions rotate pairs of channels, so they need an even width"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if _flag(config, flag, where, default=False):
            raise ModelConfigError(
                f"{where}: {flag} is true, but the built-in model has no biases: "
                f"set {flag} to false (or leave it out) to plan this shape"
            )
    return ModelShape(
        name=_name(config, source),
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        ffn_dim=ffn_dim,
        vocab_size=vocab_size,
        default_seq_len=min(max_positions, LONGEST_DEFAULT_SEQ_LEN),
        norm_eps=_positive_float(config, "rms_norm_eps", where, default=DEFAULTS["rms_norm_eps"]),
        rope_theta=_rope_theta(config, where),
        tie_embeddings=_flag(config, "tie_word_embeddings", where, default=False),
    )


def _read_object(file: Path) -> dict[str, object]:
    where = f"--model-config {file}"
    try:
        size = file.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ModelConfigError(
                f"{where} is {size / 2**20:.0f} MiB, not a config.json: give the model's "
                "config.json (its shape), not its weights"
            )
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ModelConfigError(f"{where}: no such file: give the path of a Hugging Face style config.json") from None
    except OSError as error:
        raise ModelConfigError(
            f"{where}: cannot read it ({error.strerror or error}): check the path and its permissions"
        ) from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{where} is not JSON (not UTF-8 text): give the model's config.json") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelConfigError(
            f"{where} is not JSON (line {error.lineno}: {error.msg}): give the model's config.json"
        ) from None
    if not isinstance(config, dict):
        raise ModelConfigError(
            f"{where} holds a JSON {_json_kind(config)}, not an object of config fields: give the model's config.json"
        )
    return config


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "boolean" if isinstance(value, bool) else "number"


def _check_family(config: dict[str, object], where: str) -> None:
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    names = architectures if isinstance(architectures, list) else [architectures] if architectures else []
    wrong = []
    if model_type is not None and model_type not in MODEL_TYPES:
        wrong.append(f"model_type {model_type!r}")
    wrong += [f"architecture {name!r}" for name in names if name not in ARCHITECTURES]
    if wrong:
        raise ModelConfigError(
            f"{where}: meshtop builds Llama-family decoders ({', '.join(MODEL_TYPES)}); got {', '.join(wrong)}"
        )
    if model_type is None and not names:
        raise ModelConfigError(
            f"{where} names no model_type or architectures: meshtop builds Llama-family "
            f"decoders; give a config.json with model_type {' or '.join(MODEL_TYPES)}"
        )


def _positive_int(config: dict[str, object], field: str, where: str, *, default: int | None = None) -> int:
    value = config.get(field)
    if value is None:
        if default is None:
            raise ModelConfigError(f"{where} has no {field}: a Llama-family config.json gives it (a positive integer)")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{where}: {field} must be a positive integer, got {json.dumps(value)}")
    return value


def _positive_float(config: dict[str, object], field: str, where: str, *, default: float) -> float:
    value = config.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ModelConfigError(f"{where}: {field} must be a number above 0, got {json.dumps(value)}")
    return float(value)


def _rope_theta(config: dict[str, object], where: str) -> float:
    """``rope_theta``, or where newer transformers releases keep it: ``rope_parameters.rope_theta``."""
    parameters = config.get("rope_parameters")
    if config.get("rope_theta") is None and isinstance(parameters, dict) and "rope_theta" in parameters:
        return _positive_float(parameters, "rope_theta", where, default=DEFAULTS["rope_theta"])
    return _positive_float(config, "rope_theta", where, default=DEFAULTS["rope_theta"])


def _flag(config: dict[str, object], field: str, where: str, *, default: bool) -> bool:
    value = config.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(f"{where}: {field} must be true or false, got {json.dumps(value)}")
    return value


def _name(config: dict[str, object], source: Path) -> str:
    """``meta-llama/Llama-3.2-1B`` -> ``Llama-3.2-1B``; else ``.../Llama-3.2-1B/config.json`` -> its folder's
    name; else the file's stem (``my-model.json`` -> ``my-model``)."""
    given = config.get("_name_or_path")
    named = PurePosixPath(given.replace("\\", "/").rstrip("/")).name if isinstance(given, str) else ""
    if named:
        return named
    if source.name == "config.json":
        folder = source.absolute().parent.name
        if folder:
            return folder
    return source.stem
