"""`python -m veloxquant.tools.cli ...`: the same as the `veloxquant` command."""
import sys

from veloxquant.tools.cli import main

sys.exit(main())
