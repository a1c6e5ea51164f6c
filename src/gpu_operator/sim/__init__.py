"""Simulation, for tests, the testenv and demos: the simulated NVML (:mod:`.nvml`) with its GPU
profiles, the stub driver's libraries (:mod:`.stubdriver`), the driver and toolkit stand-ins
(:mod:`.operands`), the agent commands that exist only for simulation (:mod:`.commands`) and
simulated nodes' DRA pools (:mod:`.dra`). Neither product code nor the agents import it: the
command line registers it with the agents' NVML loader (:mod:`.registration`) for
``--simulate`` and the stub driver, and adds its commands to theirs.
"""
