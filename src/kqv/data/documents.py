"""Documents of a text, the mask symbol and prompt templates: what span corruption and data mixtures read.

A text is cut into *documents* (each non-blank line, or the parts between `data.delimiter`, surrounding whitespace
removed) so that an objective can work one document at a time (`kqv.data.document_batches`). A document is split
into sentences (after `.`, `!` or `?` and whitespace) for sentence-order augmentation.

The *mask* is a symbol of the tokenizer that no text holds: a character tokenizer reserves one character (default
U+2047 `⁇`), a BPE tokenizer a special token (default `<mask>`), matched whole. A text that already holds it is
refused (`check_unused`), so the model never confuses a masked span with the text itself.

A *prompt template* (`data.template`, e.g. `"{prompt}{mask}"`) rewrites every prompt of a file of pairs so that a
fine-tune reuses its pretraining's format: `{prompt}` is the pair's prompt, `{mask}` the tokenizer's mask symbol.
"""

from __future__ import annotations

import re
import string

from ..errors import ConfigError, DataError
from .completions import Example, end_of_text
from .tokenizers import Tokenizer

MASKS = {"char": "\u2047", "bpe": "<mask>"}  # the mask symbol each tokenizer kind reserves unless data.mask names one
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
PLACEHOLDERS = ("prompt", "mask")


def read_documents(text: str, delimiter: str | None = None) -> list[str]:
    """The documents of `text`: its lines (split at newlines alone), or its parts between `delimiter`; each with
    surrounding whitespace removed, blank ones skipped."""
    parts = text.split("\n") if delimiter is None else text.split(delimiter)
    return [part.strip() for part in parts if part.strip()]


def split_sentences(document: str) -> list[str]:
    """The sentences of `document`: cut after `.`, `!` or `?` followed by whitespace (the whitespace dropped)."""
    return [sentence for sentence in SENTENCE_END.split(document) if sentence]


def windows(ids: list[int], size: int) -> list[list[int]]:
    """`ids` cut into consecutive windows of at most `size` tokens (one window when it fits)."""
    return [ids[start : start + size] for start in range(0, max(len(ids), 1), size)]


def mask_symbol(mask: str | None, kind: str) -> str:
    """The mask symbol: `mask` (data.mask) if given, else the one the tokenizer `kind` reserves by default."""
    return mask if mask is not None else MASKS.get(kind, MASKS["bpe"])


def check_unused(texts: list[str], mask: str, where: str) -> None:
    """Refuse, in one line, text that already holds the mask symbol (it would read as a masked span)."""
    for number, text in enumerate(texts, 1):
        if mask in text:
            count = sum(t.count(mask) for t in texts)
            raise DataError(
                f"{where} already contains the mask symbol {mask!r} ({count}x, first in item {number}); the mask "
                f"must be a symbol no text holds: choose another with data.mask, or remove it from the text"
            )


def mask_id(tokenizer: Tokenizer, mask: str, where: str = "the tokenizer") -> int:
    """The id of the mask symbol, one token of `tokenizer`; ConfigError if it has none."""
    try:
        ids = [tokenizer.token_to_id(mask)]
    except KeyError:
        ids = []
    if len(ids) != 1:
        raise ConfigError(
            f"{where} has no mask symbol {mask!r} (a character tokenizer reserves one when it is made for "
            f"span corruption or a template with {{mask}}, a BPE tokenizer a special token); pretrain with "
            f"data.objective='span_corruption', or name the tokenizer's own symbol with data.mask"
        )
    if ids[0] == end_of_text_id(tokenizer):
        refuse_end_of_text_mask(mask, where, tokenizer.kind)
    return ids[0]


def refuse_end_of_text_mask(mask: str, where: str, kind: str) -> None:
    """ConfigError for a mask symbol that is the tokenizer's end of text: a masked span would read as the end."""
    raise ConfigError(
        f"data.mask {mask!r} is the end of text of {where}, which closes every example, so a masked span would read "
        f"as the example's end; choose another symbol with data.mask, or drop it for the default "
        f"({mask_symbol(None, kind)!r})"
    )


def end_of_text_id(tokenizer: Tokenizer) -> int | None:
    """The id of the token that ends every example, or None for a tokenizer that has none."""
    try:
        return end_of_text(tokenizer)[0]
    except DataError:
        return None


def template_fields(template: str) -> list[tuple[str, str, str | None]]:
    """(name, format spec, conversion) of each replacement field of `template`, as str.format reads them; a
    ConfigError for a template str.format cannot read (a lone brace)."""
    try:
        return [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as error:
        raise ConfigError(
            f"data.template {template!r} is not a template ({error}); write e.g. '{{prompt}}{{mask}}'"
        ) from None


def check_template(template: str) -> None:
    """Refuse a template without `{prompt}`, with another placeholder than `{prompt}` and `{mask}`, or with a
    conversion or a format spec (`{prompt!r}` would write each prompt in quotes, `{prompt:d}` cannot write text)."""
    fields = template_fields(template)
    unknown = sorted({name for name, _, _ in fields} - set(PLACEHOLDERS))
    if unknown:
        raise ConfigError(
            f"data.template {template!r} names {unknown}; it may hold only {{prompt}} and {{mask}} (write a brace "
            f"as {{{{ or }}}})"
        )
    formatted = [
        f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
        for name, spec, conversion in fields
        if spec or conversion
    ]
    if formatted:
        raise ConfigError(
            f"data.template {template!r} formats a placeholder ({formatted[0]}); a template writes {{prompt}} and "
            f"{{mask}} as they are: drop the conversion or format spec after the name"
        )
    if "prompt" not in {name for name, _, _ in fields}:
        raise ConfigError(
            f"data.template {template!r} has no {{prompt}}, so every prompt would be the same text; write where "
            f"the prompt goes, e.g. '{{prompt}}{{mask}}'"
        )


def has_mask(template: str | None) -> bool:
    """Whether `template` writes the mask symbol (a `{mask}` field; `{{mask}}` is the text "{mask}")."""
    return template is not None and any(name == "mask" for name, _, _ in template_fields(template))


def apply_template(template: str | None, prompt: str, mask: str) -> str:
    """`prompt` written into `template` (None: the prompt as it is), `{mask}` the mask symbol."""
    return prompt if template is None else template.format(prompt=prompt, mask=mask)


def templated(
    examples: list[Example], template: str | None, tokenizer: Tokenizer, mask: str | None, where: str
) -> list:
    """`examples` with every prompt written into `template` (None: unchanged). A template with `{mask}` needs the
    mask symbol `mask` to be one token of `tokenizer` and absent from the examples' own text."""
    if template is None:
        return examples
    if has_mask(template):
        check_unused([t for e in examples for t in (e.prompt, e.completion)], mask, where)
        mask_id(tokenizer, mask)
    return [Example(apply_template(template, e.prompt, mask or ""), e.completion, e.line, e.kind) for e in examples]
