"""The GPUCluster loop: the DRA stack from the GPUCluster (``decide.py``, pure), run by its
shell (``reconciler.py``)."""
