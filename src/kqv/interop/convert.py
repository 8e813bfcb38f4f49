"""`from_hf` and `to_hf`: read a checkpoint through an architecture's mapping into a kqv model, and back; the
look-up of the architecture and the checks that no tensor is lost on the way."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, ConfigTypeError, ConversionError
from ..nn.config import ModelConfig
from ..nn.vocabulary import real_rows
from .architectures import ARCHITECTURES, CONFIG_SCHEMAS
from .rules import Architecture, HFOrigin, converted, renamed, require_kqv

# ---------------------------------------------------------------------------------------------------------------
# Public interface


def from_hf(source: nn.Module | str | Path, *, vocab_multiple: int = 1) -> nn.Module:
    """A kqv model with the weights of a Hugging Face model, in eval mode.

    `source` is a model object of a class in `ARCHITECTURES` or a local directory written by `save_pretrained`
    (`config.json` + `model.safetensors`, or sharded safetensors with an index). The kqv model is built in torch's
    default dtype (float32); weights stored in another dtype are cast to it.

    Its outputs equal the Hugging Face model's: the logits of GPT-2, Marian, BART and BERT's masked-LM head, the
    last hidden states of `BertModel`. BERT's token types are folded into the position table, which is exact for
    token_type_ids = 0 (one segment, the default); kqv has no second segment. `model.hf_origin` keeps what kqv does
    not compute with, for `to_hf`. `vocab_multiple` pads its vocabulary as `ModelConfig.vocab_multiple` does (64:
    GPT-2's 50,257 tokens become 50,304 rows), the padded rows zero; its outputs stay the checkpoint's.
    """
    if isinstance(source, (str, Path)):
        hf_config, weights = read_hf_directory(source)
        class_names = list(getattr(hf_config, "architectures", None) or [])
    elif isinstance(source, nn.Module) and hasattr(source, "config"):
        hf_config, weights = source.config, source.state_dict()
        class_names = [type(source).__name__]
    else:
        raise ConfigTypeError(f"from_hf takes a Hugging Face model or a directory path, got {type(source).__name__}")
    arch = architecture(hf_config, class_names)
    try:
        config = arch.config_from_hf(hf_config).replace(vocab_multiple=vocab_multiple)
    except ConfigError as error:  # a value kqv's ModelConfig refuses
        if not isinstance(source, (str, Path)):
            raise
        raise ConversionError(f"{Path(source) / 'config.json'} describes a model kqv cannot build: {error}") from None
    mapping = arch.mapping(config, hf_config)
    checkpoint = HFWeights(renamed(weights, arch.renamed), arch.base_prefix)
    state: dict[str, Tensor] = {}
    kept: dict[str, Tensor] = {}
    for rule in mapping.rules:
        originals = [checkpoint.take(name) for name in rule.hf]
        state |= dict(zip(rule.kqv, converted(rule, originals), strict=True))
        if rule.keep:
            kept |= dict(zip(rule.hf, originals))
    for name in mapping.aliases:  # the same tensor as one a rule took (a model object lists tied weights twice)
        checkpoint.discard(name)
    for name, expected in mapping.computed.items():
        if name in checkpoint:
            check_computed(name, checkpoint.take(name), expected())
    kept |= checkpoint.take_matching(mapping.unused)
    checkpoint.check_all_used(arch.ignored)
    model = arch.kqv_model(config)
    load_exactly(model, padded_state(model, state))
    model.hf_origin = HFOrigin(arch.hf_class, hf_config.to_dict(), kept)
    return model.eval()


def to_hf(model: nn.Module, architecture_name: str | None = None, **config_options: Any) -> nn.Module:
    """The Hugging Face model with the weights of a kqv model, in eval mode: the inverse of `from_hf`.

    `architecture_name` picks the Hugging Face class when there is a choice (an `EncoderDecoder` becomes a
    `MarianMTModel` or a `BartForConditionalGeneration`); by default it is the class the model came from, else the
    first whose options the config fits. A model made by `from_hf` gets back its whole Hugging Face config and the
    tensors kqv kept aside, so `to_hf(from_hf(m))` has `m`'s state dict. `config_options` set Hugging Face config
    fields kqv knows nothing of (e.g. `pad_token_id=0, decoder_start_token_id=1` for a translation model).
    ValueError names every kqv option the chosen class cannot represent.
    """
    import transformers

    arch = export_architecture(model, architecture_name)
    require_kqv(model.config, arch.hf_class, attention="full", ffn="dense")  # no sparse cores or experts there
    origin = getattr(model, "hf_origin", None)
    from_same_class = isinstance(origin, HFOrigin) and origin.hf_class == arch.hf_class
    base = dict(origin.config) if from_same_class else {}
    kept = dict(origin.kept) if from_same_class else {}
    hf_config = build_hf_config(arch, model.config, base, config_options)
    mapping = arch.mapping(model.config, hf_config)
    kqv_state = unpadded_state(model)
    state: dict[str, Tensor] = {}
    for rule in mapping.rules:
        tensors = [kqv_state[name] for name in rule.kqv]
        if rule.keep:
            originals = [kept.get(name) for name in rule.hf]
            converted = rule.to_hf(*tensors, originals=None if any(t is None for t in originals) else originals)
        else:
            converted = rule.to_hf(*tensors)
        state |= dict(zip(rule.hf, converted, strict=True))
    check_all_exported(model, kqv_state, {name for rule in mapping.rules for name in rule.kqv}, arch.hf_class)
    for name, tensor in kept.items():
        state.setdefault(name, tensor)
    for name, kqv_name in mapping.fill.items():
        state.setdefault(name, kqv_state[kqv_name])
    hf_model = getattr(transformers, arch.hf_class)(hf_config, **arch.hf_options(state))
    missing, unexpected = hf_model.load_state_dict({arch.hf_name(n): t for n, t in state.items()}, strict=False)
    not_filled = set(missing) - {arch.hf_name(n) for n in [*mapping.aliases, *mapping.computed]}
    if unexpected or not_filled:
        raise RuntimeError(
            f"kqv.interop's {arch.hf_class} mapping is incomplete: missing {sorted(not_filled)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return hf_model.eval()


def config_from_hf(hf_config: Any) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face config (`GPT2Config`, `BertConfig`, `MarianConfig`, `BartConfig`);
    ValueError for anything else."""
    return architecture(hf_config).config_from_hf(hf_config)


def read_hf_directory(path: str | Path) -> tuple[Any, dict[str, Tensor]]:
    """(Hugging Face config, weights by name) from a local model directory; safetensors only, no network.

    Before transformers reads config.json or any weight loads, config.json is checked as data (`read_config_json`,
    and field by field for the architectures of `CONFIG_SCHEMAS`: types, ranges and every weight's shape against
    the safetensors headers, read without loading a tensor): whatever is wrong is a one-line `ConversionError` that
    names the file and the field."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConversionError(f"{path} is not a Hugging Face model directory: it has no config.json")
    from safetensors.torch import load_file
    from transformers import AutoConfig

    values = read_config_json(path / "config.json")
    files = weight_files(path)
    check_config(values, path / "config.json", header_shapes(files))
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001 -- ValueError, TypeError, OSError or huggingface_hub's own, on a bad file
        raise ConversionError(
            f"{path / 'config.json'}: transformers cannot read it ({first_line(error)}); correct that field, or save "
            f"the model again with save_pretrained"
        ) from None
    weights = {}
    for file in files:
        weights.update(guarded(file, load_file))
    return hf_config, weights


def read_config_json(file: Path) -> dict[str, Any]:
    """The settings of a Hugging Face config.json: a JSON object with a model_type, else a ConversionError."""
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ConversionError(f"{file} is not UTF-8 ({error.reason} at byte {error.start}); save it as UTF-8") from None
    except RecursionError:
        raise ConversionError(
            f"{file} is JSON nested too deeply to read; it should be one object of settings"
        ) from None
    except ValueError as error:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise ConversionError(
            f"{file} is not JSON ({first_line(error)}); save the model again with save_pretrained"
        ) from None
    if not isinstance(values, dict):
        raise ConversionError(
            f"{file} holds a JSON {json_kind(values)}, not an object of settings such as "
            f'{{"model_type": "gpt2", ...}}; save the model again with save_pretrained'
        )
    if not isinstance(values.get("model_type"), str):
        kinds = sorted({a.model_type for a in ARCHITECTURES.values()})
        raise ConversionError(
            f'{file} has no "model_type" (a string, one of {kinds} for kqv); add it, or save the model again with '
            f"save_pretrained"
        )
    return values


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory: model.safetensors, or the shards its index names."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            shards = bool(names) and all(isinstance(name, str) and name == Path(name).name for name in names)
            problem = "" if shards else "its weight_map names no shard files of this directory"
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            problem = first_line(error)
        if problem:
            raise ConversionError(f"{index} is not a safetensors index ({problem}); save the model again")
        missing = [name for name in names if not (path / name).is_file()]
        if missing:
            raise ConversionError(f"{index} names shards that are missing: {missing[:4]}; download or save them")
        return [path / name for name in names]
    pickles = sorted(p.name for p in path.glob("*.bin"))
    found = f"only {', '.join(pickles)}, which is a pickle" if pickles else "no weights"
    raise ConversionError(
        f"{path} has {found}; kqv reads model.safetensors only, because unpickling a checkpoint can run "
        f"arbitrary code. Convert it where you trust the file: "
        f"AutoModel.from_pretrained(path).save_pretrained(path, safe_serialization=True)"
    )


def guarded(file: Path, read: Any) -> Any:
    """`read(file)` for a safetensors file; a ConversionError naming it when it is truncated or damaged (an
    OSError, such as a file it may not read, stays one: the command line names it with the system's reason)."""
    from safetensors import SafetensorError

    try:
        return read(file)
    except (SafetensorError, ValueError) as error:
        raise ConversionError(
            f"{file} is not a readable safetensors file ({first_line(error)}): it is truncated or damaged; download "
            f"or save the model again"
        ) from None


def header_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Each weight's (shape, file), from the safetensors headers alone: no tensor is read."""
    from safetensors import safe_open

    def read(file: Path) -> dict[str, tuple[tuple[int, ...], Path]]:
        with safe_open(file, "pt") as weights:
            return {name: (tuple(weights.get_slice(name).get_shape()), file) for name in weights.keys()}  # noqa: SIM118

    return {name: shape for file in files for name, shape in guarded(file, read).items()}


KINDS = {
    "count": "an integer of at least 1",
    "count or null": "an integer of at least 1, or null",
    "positive": "a positive number",
    "fraction": "a number from 0 to 1",
    "bool": "true or false",
    "string": "a string",
    "names": "a list of class names",
}


def fits(kind: str, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "count": lambda: isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        "count or null": lambda: value is None or fits("count", value),
        "positive": lambda: number and math.isfinite(value) and value > 0,
        "fraction": lambda: number and 0 <= value <= 1,
        "bool": lambda: isinstance(value, bool),
        "string": lambda: isinstance(value, str),
        "names": lambda: value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }[kind]()


def check_config(values: dict[str, Any], file: Path, shapes: dict[str, tuple[tuple[int, ...], Path]]) -> None:
    """ConversionError, naming `file` and the field, when config.json's `values` of a model_type in `CONFIG_SCHEMAS`
    hold a field of the wrong type or range, or describe weights of other shapes than the headers' (`shapes`).
    A field config.json leaves out takes transformers' default, as it would when the model loads."""
    schema = CONFIG_SCHEMAS.get(values["model_type"])
    if schema is None:  # the other architectures: transformers and the conversion check them
        return
    for name, kind in schema.fields.items():
        if name in values and not fits(kind, values[name]):
            raise ConversionError(f"{file}: {name} must be {KINDS[kind]}, got {shown(values[name])}")
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(values["model_type"]).to_dict()
    given = {name: values.get(name, defaults.get(name)) for name in schema.fields}
    heads, width = schema.heads
    if given[width] % given[heads]:
        raise ConversionError(f"{file}: {heads} ({given[heads]}) must divide {width} ({given[width]})")

    def said(field: str) -> str:
        if field not in values:
            return f"{field} is missing (so {values['model_type']}'s default {shown(given[field])} applies)"
        return f"{field} is {shown(given[field])}"

    weights = {name.removeprefix(schema.prefix): (shape, file, name) for name, (shape, file) in shapes.items()}
    pattern = re.escape(schema.block).replace(r"\{\}", r"(\d+)") + r"\."
    blocks = {int(match.group(1)) for name in weights if (match := re.match(pattern, name))}
    layers = given[schema.layers]
    if len(blocks) != layers or (blocks and max(blocks) != layers - 1):
        held = f"{schema.block.format(min(blocks))} to {schema.block.format(max(blocks))}" if blocks else "none"
        raise ConversionError(
            f"{file}: {said(schema.layers)}, but the weights hold {len(blocks)} blocks ({held}); set "
            f"{schema.layers} to the number of blocks the weights were saved with"
        )
    for name, expected in schema.shapes(given, layers).items():
        if name not in weights:  # the conversion names a missing weight (GPT-2's lm_head is tied unless saved)
            continue
        (shape, where, saved), want = weights[name], tuple(size for size, _ in expected)
        if shape != want:
            field = next((f for (size, f), got in zip(expected, shape) if size != got), expected[0][1])
            raise ConversionError(
                f"{file}: {said(field)}, but {where.name}'s {saved} has shape {shape}, not {want}; set {field} to "
                f"what the weights were saved with"
            )


def shown(value: Any) -> str:
    """A config.json value as JSON writes it, cut to 60 characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_kind(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def first_line(error: BaseException) -> str:
    """An exception's message on one line, cut to 200 characters (a library's may run to many)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def supported() -> str:
    return "; ".join(
        f"{a.hf_class} (model_type {a.model_type!r}) {'<->' if a.exported else '->'} kqv.{a.kqv_class.__name__}"
        for a in ARCHITECTURES.values()
    )


def architecture(hf_config: Any, class_names: list[str] | None = None) -> Architecture:
    """The `ARCHITECTURES` entry for a config (and, when known, the model classes); ValueError if there is none."""
    model_type = getattr(hf_config, "model_type", None)
    of_type = [a for a in ARCHITECTURES.values() if a.model_type == model_type]
    unsupported = [
        name for name in class_names or [] if name not in ARCHITECTURES or ARCHITECTURES[name].model_type != model_type
    ]
    if not of_type or unsupported:
        what = ", ".join(unsupported) if unsupported else f"model_type {model_type!r}"
        raise ConversionError(f"kqv.interop cannot convert {what}; supported architectures: {supported()}")
    return ARCHITECTURES[class_names[0]] if class_names else of_type[0]


def export_architecture(model: nn.Module, name: str | None) -> Architecture:
    """The Hugging Face class a kqv model becomes: `name`, else the one it came from, else the first that fits.
    When none fits, the refusal is the nearest class's (the fewest options to change), or each class's in a tie."""
    candidates = [a for a in ARCHITECTURES.values() if type(model) is a.kqv_class and a.exported]
    if not candidates:
        kinds = sorted({a.kqv_class.__name__ for a in ARCHITECTURES.values()})
        raise ConversionError(
            f"to_hf converts kqv models of the classes {kinds}, not {type(model).__name__}; "
            f"supported architectures: {supported()}"
        )
    if name is not None:
        if name not in [a.hf_class for a in candidates]:
            raise ConversionError(
                f"a kqv.{type(model).__name__} cannot become a {name}; it can become "
                f"{' or '.join(a.hf_class for a in candidates)}"
            )
        return ARCHITECTURES[name]
    origin = getattr(model, "hf_origin", None)
    candidates.sort(key=lambda a: not (isinstance(origin, HFOrigin) and origin.hf_class == a.hf_class))
    reasons = []
    for arch in candidates:
        try:
            arch.config_to_hf(model.config, {})
            return arch
        except ValueError as error:
            reasons.append((getattr(error, "misses", 1), str(error)))
    nearest = min(misses for misses, _ in reasons)
    raise ConversionError("; or ".join(reason for misses, reason in reasons if misses == nearest))


def build_hf_config(arch: Architecture, config: ModelConfig, base: dict[str, Any], options: dict[str, Any]) -> Any:
    """The Hugging Face config: `base` (the original one, if any), the fields from kqv's config, then `options`."""
    from transformers import AutoConfig

    values = {**base, **arch.config_to_hf(config, base), **options, "architectures": [arch.hf_class]}
    for name in ("model_type", "transformers_version"):
        values.pop(name, None)
    hf_config = AutoConfig.for_model(arch.model_type, **values)
    vocab = hf_config.vocab_size
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"):
        value = getattr(hf_config, name, None)
        if name not in base and name not in options and isinstance(value, int) and not 0 <= value < vocab:
            # a default of the Hugging Face class (GPT-2's 50256) that this vocabulary does not have
            setattr(hf_config, name, vocab - 1 if name in ("pad_token_id", "decoder_start_token_id") else None)
    return hf_config


class HFWeights:
    """Hugging Face weights by name, base-model prefix removed, handed out once each so none is lost unnoticed."""

    def __init__(self, weights: dict[str, Tensor], prefix: str):
        self.weights = {name.removeprefix(prefix): tensor for name, tensor in weights.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def take(self, name: str) -> Tensor:
        if name not in self.weights:
            raise ConversionError(f"the checkpoint has no weight {name!r}; does it match its config?")
        tensor = self.weights.pop(name)
        return tensor.to(torch.get_default_dtype()) if tensor.is_floating_point() else tensor

    def discard(self, name: str) -> None:
        self.weights.pop(name, None)

    def take_matching(self, patterns: list[str]) -> dict[str, Tensor]:
        return {name: self.take(name) for name in sorted(self.weights) if any(re.fullmatch(p, name) for p in patterns)}

    def check_all_used(self, ignored: tuple[str, ...]) -> None:
        left = sorted(n for n in self.weights if not any(re.fullmatch(p, n) for p in ignored))
        if left:
            raise ConversionError(
                f"the checkpoint has weights kqv has no place for: {left[:8]}{' ...' if len(left) > 8 else ''}"
            )


def check_computed(name: str, tensor: Tensor, expected: Tensor) -> None:
    if tensor.shape != expected.shape or not torch.allclose(tensor, expected, atol=1e-3):
        raise ConversionError(
            f"the checkpoint's {name} is not the fixed table kqv computes (shape {tuple(tensor.shape)}, "
            f"expected {tuple(expected.shape)}); kqv cannot represent a changed one"
        )


def unpadded_state(model: nn.Module) -> dict[str, Tensor]:
    """`model`'s state dict with a padded vocabulary's tensors cut to their real rows (`kqv.nn.vocabulary`): the
    tensors of a checkpoint of the real vocabulary."""
    rows = real_rows(model)
    return {name: tensor[: rows[name]] if name in rows else tensor for name, tensor in model.state_dict().items()}


def padded_state(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state`, converted from a checkpoint of the real vocabulary, with each of `model`'s padded vocabulary
    tensors grown by zero rows to the model's padded size (the inverse of `unpadded_state`)."""
    rows, shapes = real_rows(model), {name: tuple(t.shape) for name, t in model.state_dict().items()}
    padded = dict(state)
    for name in rows.keys() & state.keys():
        tensor, size = state[name], shapes[name][0]
        if tensor.shape[0] == rows[name] < size:  # a tensor of another size is load_exactly's to refuse
            padded[name] = torch.cat((tensor, tensor.new_zeros(size - rows[name], *tensor.shape[1:])))
    return padded


def tied_groups(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name of the same tensor (tied weights appear under several names)."""
    by_tensor: dict[int, set[str]] = {}
    names = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names[name] = by_tensor.setdefault(id(tensor), set())
        names[name].add(name)
    return names


def load_exactly(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Load `state` into `model`; every name must be filled, directly or through a weight tied to it. A tensor of
    another shape than the model's (a config.json that does not describe its weights) is a ConversionError."""
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    wrong = [(name, tuple(t.shape)) for name, t in state.items() if name in shapes and tuple(t.shape) != shapes[name]]
    if wrong:
        (name, shape), more = wrong[0], f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise ConversionError(
            f"the checkpoint's weights do not fit its config: {name} is {shape}, the config makes it "
            f"{shapes[name]}{more}; correct config.json to describe the weights saved beside it"
        )
    missing, unexpected = model.load_state_dict(state, strict=False)
    groups = tied_groups(model)
    unfilled = [name for name in missing if not groups[name] & state.keys()]
    if unfilled or unexpected:
        raise RuntimeError(
            f"kqv.interop's mapping for {type(model).__name__} is incomplete: unfilled {unfilled}, "
            f"unexpected {sorted(unexpected)}"
        )


def check_all_exported(model: nn.Module, kqv_state: dict[str, Tensor], exported: set[str], hf_class: str) -> None:
    groups = tied_groups(model)
    left = sorted(name for name in kqv_state if not groups[name] & exported)
    if left:
        raise ConversionError(f"the kqv model has weights {left[:8]} that a {hf_class} has no place for")
