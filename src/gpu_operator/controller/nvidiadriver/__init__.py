"""The NVIDIADriver loop: driver pools, their DaemonSets, upgrades and statuses
(``decide.py``, pure), run by its shell (``reconciler.py``)."""
