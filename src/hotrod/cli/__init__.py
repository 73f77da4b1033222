"""The `hotrod` command: `main` parses and dispatches (a thin layer over the Python API), `describe` is what
`hotrod info` prints; `hotrod serve`'s options are in `hotrod.serve.command`."""

from hotrod.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
