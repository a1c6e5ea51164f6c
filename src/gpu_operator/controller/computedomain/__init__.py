"""The ComputeDomain loop: each domain's IMEX daemons, claim templates, status and teardown
(``decide.py``, pure); its shell is still to come."""
