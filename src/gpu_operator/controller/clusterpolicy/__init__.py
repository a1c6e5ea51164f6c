"""The ClusterPolicy loop: operands, node labels, the driver upgrade and health remediation
from the active ClusterPolicy (``decide.py``, pure), run by its shell (``reconciler.py``)."""
