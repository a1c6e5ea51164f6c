"""Simulation, for tests, the testenv and demos: the simulated NVML (:mod:`.nvml`) with its GPU
profiles, the stub driver's libraries (:mod:`.stubdriver`), the driver and toolkit stand-ins
(:mod:`.operands`), the agent commands that exist only for simulation (:mod:`.commands`) and
simulated nodes' DRA pools (:mod:`.dra`). Product code never imports it at module level: only
the agents' ``--simulate`` handling and the NVML loader's hand-over to a stub driver do, inside
functions; the command line adds its commands to the agents'.
"""
