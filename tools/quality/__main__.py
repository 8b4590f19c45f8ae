"""`python -m veloxquant.tools.quality ...`: the same arguments as `veloxquant quality`."""
import argparse
import sys

from . import __doc__ as _doc, add_arguments, run

parser = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality", description=_doc.splitlines()[0])
add_arguments(parser)
ns = parser.parse_args()
ns.command_line = " ".join(["python -m veloxquant.tools.quality", *sys.argv[1:]])
sys.exit(run(ns))
