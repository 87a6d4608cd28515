"""``python -m attention_tutorial``: the command line (:mod:`attention_tutorial.cli`), Ctrl-C handled as it describes."""

from .cli import main

raise SystemExit(main())
