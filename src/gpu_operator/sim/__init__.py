"""Simulation, for tests, the testenv and demos: the simulated NVML (:mod:`.nvml`) with its GPU
profiles, the stub driver's libraries (:mod:`.stubdriver`), and the driver and toolkit
stand-ins (:mod:`.operands`). Product code never imports it at module level: only the agents'
``--simulate`` handling and the NVML loader's hand-over to a stub driver do, inside functions.
"""
