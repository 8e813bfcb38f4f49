"""kqv_lab's commands of `kqv`: `kqv experiment` and `kqv world`, each a `kqv.cli.Command` that pyproject.toml names
in the entry-point group "kqv.commands", so kqv's command line finds it without importing kqv_lab."""
