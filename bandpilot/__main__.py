"""``python -m bandpilot`` is the ``bandpilot`` command."""

import sys

from bandpilot.cli.main import main

sys.exit(main())
