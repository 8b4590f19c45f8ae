"""`python -m veloxquant.tools.quality ...`: the same arguments as `veloxquant quality`."""
import argparse
import sys

from . import __doc__ as _doc, add_arguments, run
from .._env import command_line

parser = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality", description=_doc.splitlines()[0])
add_arguments(parser)
ns = parser.parse_args()
ns.command_line = command_line("python -m veloxquant.tools.quality")
sys.exit(run(ns))
