"""``python -m gpu_operator`` is the ``gpu-operator`` command."""

import sys

from gpu_operator.cli import main

sys.exit(main())
