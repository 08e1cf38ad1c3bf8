"""The ``littleghost`` command line: an operator's view of the sessions in a store
(``littleghost sessions list|show|view|compact|export|delete``; also ``python -m littleghost``)."""

from littleghost.cli.commands import main

__all__ = ["main"]
