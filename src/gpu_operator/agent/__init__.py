"""Node agents: GPU feature discovery, MIG manager, metrics exporter, validator.

All of them read the GPU through one NVML adapter (:mod:`gpu_operator.agent.nvml`), which
can run against a simulated NVML (:mod:`gpu_operator.sim.nvml`) where there is no GPU. None of
them imports the simulation, which sits above them: the command line registers it with the
adapter (:func:`gpu_operator.agent.nvml.register_simulation`).
"""
