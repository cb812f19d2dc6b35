"""The command line: ``python -m mlm_adapt fit|validate|test|prepare|preview|export|fill-mask|vocab|plot``."""

from mlm_adapt.cli.commands import main

__all__ = ["main"]
