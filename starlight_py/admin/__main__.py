import sys

from starlight_py.admin.cli import main

sys.exit(main())
