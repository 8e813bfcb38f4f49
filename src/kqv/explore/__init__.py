"""Looking inside trained models: attention plots (`plots`) and `kqv explore`, a local web app.

The app's layers, bottom up: `analysis` (attention weights and logits -> the numbers every view draws),
`sparse_views` (weights of Linformer and BigBird, which never form them), `subjects` (one class per kind of model:
what the page may ask of it), `loading` (the one place a run is loaded), `export` (one self-contained HTML file),
`app` (the Starlette app, its JSON API and `serve`), `notebook` (`show`: the page inline in Jupyter), and `static/`
(the page: plain JS, SVG and canvas). docs/explorer.md describes the views and the API.
"""

from .app import BackgroundServer, create_app
from .notebook import show

__all__ = ["BackgroundServer", "create_app", "show"]
