"""The explorer in a notebook: `kqv.explore.show(run, text)` displays the page of one input inline in Jupyter.

The page is the self-contained HTML file of "Save as HTML" (`kqv.explore.export.standalone_page`: style, script
and the analysis inlined), shown in a sandboxed iframe through its `srcdoc` attribute, escaped, so that nothing of
it reaches the notebook's own page and it needs no server:

    import kqv.explore
    kqv.explore.show("runs/lm", "To be, or not to be")            # a run directory, `minilm`, or a HF directory
    kqv.explore.show(kqv.load("runs/mt"), "eins zwei", beam=2)    # or a loaded run
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from ..errors import ConfigTypeError
from ..jobs.base import run_inputs
from ..train.files import refuse_writing_over, write_text
from .export import standalone_page


class Shown:
    """One input's explorer page, displayed by Jupyter through `_repr_html_` (an iframe), or saved with `save`."""

    def __init__(self, page: str, height: int, inputs: list[tuple[str, Path]] | None = None):
        self.page, self.height = page, height
        self.inputs = inputs or []  # what the page was made from (the run's files), which `save` never writes over

    def _repr_html_(self) -> str:
        # scripts run in the frame, but it is sandboxed from the notebook (no same origin); downloads are allowed
        # for the page's SVG/PNG export buttons
        return (
            f'<iframe class="kqv-explore" srcdoc="{html.escape(self.page, quote=True)}" '
            f'sandbox="allow-scripts allow-downloads" width="100%" height="{self.height}" '
            f'style="border: 1px solid #ddd" title="kqv explore"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        """Write the page as a self-contained HTML file (the one `kqv explore RUN --html` writes), atomically and
        after the output guard: never over a file of the run it shows, nor over anything but a regular file."""
        refuse_writing_over(path, self.inputs, "Shown.save's path")
        path = Path(path)
        write_text(path, self.page)
        return path


def subject_of(model_or_run: Any, max_tokens: int | None = None) -> Any:
    """The explorer's subject of a run directory (or `minilm`), a loaded kqv run, or a Hugging Face directory run."""
    from ..jobs.base import TrainedRun
    from ..jobs.pretrained import PretrainedRun
    from .loading import SUBJECTS, load_subject
    from .pretrained import PretrainedSubject
    from .subjects import Subject

    if isinstance(model_or_run, Subject):
        return model_or_run
    if isinstance(model_or_run, (str, Path)):
        return load_subject(model_or_run, max_tokens)
    if isinstance(model_or_run, PretrainedRun):
        return PretrainedSubject.from_run(model_or_run, max_tokens)
    if isinstance(model_or_run, TrainedRun) and model_or_run.job.name in SUBJECTS:
        return SUBJECTS[model_or_run.job.name].from_run(model_or_run, max_tokens)
    raise ConfigTypeError(
        f"kqv.explore.show takes a run directory, `minilm`, a Hugging Face model directory or a run loaded with "
        f"kqv.load, got {type(model_or_run).__name__}"
    )


def show(
    model_or_run: Any, text: str, *, view: str = "", height: int = 900, max_tokens: int | None = None, **options: Any
) -> Shown:
    """The explorer's page of `text` for `model_or_run`, shown inline when it is a notebook cell's value.

    `options` are the page's request options (`beam` for a translation run, `top_k` for a language model), `view`
    its view settings as its URL keeps them (e.g. "layer=1&cell=1.0&palette=viridis"), `height` the frame's
    height in pixels, `max_tokens` the input limit (default: the model's context, at most 1,024)."""
    subject = subject_of(model_or_run, max_tokens)
    request = {"text": text, **options}
    page = standalone_page(subject.info(), subject.analyze(request), request, view)
    return Shown(page, height, shown_inputs(model_or_run))


def shown_inputs(model_or_run: Any) -> list[tuple[str, Path]]:
    """The files of the run directory a page shows (`kqv.jobs.base.run_inputs`): a path given, or a loaded run's."""
    where = model_or_run if isinstance(model_or_run, (str, Path)) else getattr(model_or_run, "run_dir", None)
    return run_inputs(where) if where is not None and Path(where).is_dir() else []
