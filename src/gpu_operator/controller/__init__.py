"""The operator's reconcile loops, laid out by one rule: a module sits beside what uses it.

``runtime/`` is what every loop runs on and it knows no loop: the pass scheduling, the
reconciler protocol and its generic pass, the executor and its actions, the watches,
leadership, liveness, metrics and configuration. Each loop has a package, ``clusterpolicy/``,
``nvidiadriver/`` and ``gpucluster/``, with its pure judgement in ``decide.py``, its shell in
``reconciler.py`` and the helpers only it uses; no loop imports another. The modules at this
level are the pure pieces two loops share (the snapshot, readiness, Events, conditions, the
rollout and upgrade stages, driver pools, urgent changes), and ``runner.py``, which wires the
loops onto the runtime. ``pyproject.toml``'s import-linter contracts check the rule.
"""
