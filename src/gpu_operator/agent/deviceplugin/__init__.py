"""``gpu-operator agent device-plugin``: the kubelet device-plugin API for NVIDIA GPUs.

Pure parts: :mod:`config_file` (NVIDIA's ``version: v1`` config file, feature discovery's too),
:mod:`settings` (config file + env), :mod:`resources` (what is advertised under which name;
:func:`advertised_resources` also gives simulated nodes their capacity), :mod:`allocation`
(GetPreferredAllocation and Allocate answers), :mod:`cdi` (CDI names and spec), :mod:`health`
(which XIDs count, when a fault clears), :mod:`configs` (which named config applies). Shell:
:mod:`server` (one gRPC server per resource), :mod:`agent` (the loops). Nothing is imported
here: feature discovery reads :mod:`config_file`, and :mod:`resources` reads feature
discovery, so names re-exported here would make an import cycle.
"""
