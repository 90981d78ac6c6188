"""`python -m starlight_py.bench`."""

import sys

from starlight_py.bench.cli import main

sys.exit(main())
