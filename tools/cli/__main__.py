"""`python -m veloxquant.tools.cli ...`: the same as the `veloxquant` command."""
import sys

from . import main

sys.exit(main())
