"""`python -m starlight_py` is `starlight-proxy`."""

import sys

from starlight_py.cli import main

sys.exit(main())
