"""Where a unit test lives: ``tests/unit`` mirrors ``src/gpu_operator``.

- A test of ``src/gpu_operator/<path>/<mod>.py`` is ``tests/unit/<path>/test_<mod>.py``. When a
  module has several test files, or one file tests how modules of a package work together, the
  name says what it tests, in that folder: ``controller/test_readiness_scheduled.py``,
  ``agent/dra/test_dynamic_mig.py``.
- A test of a package's ``__init__`` is ``test_<package>*.py`` in the package's folder
  (``render/test_render.py``). A subpackage tested by one file, as a whole, is a module of its
  parent (``sim/test_stubdriver.py``, ``test_kubelet_api.py``) until it has more.
- A top-level module's test is at the top (``test_kube_retry.py``, ``test_node_labels.py``),
  and so are the tests of the project as a whole: CLI conventions across commands, the README's
  commands, commit messages, the benchmarks importing, the suite's worker groups
  (``tests/conftest.py``), fuzzing every policy. Tests of the examples are beside each other in
  ``install/``.
- Helpers of one folder's tests live in it (``render/render_cases.py`` with ``cases/`` and
  ``golden/``); of several folders', at the top (``rbac_grants.py``, ``netstubs.py``). Fakes of
  what the code talks to are in ``tests/fakes/``: FakeKube (``kube.py``) is the API server for
  every test that needs one; ScriptedRequests, beside it, the HTTP requests under the wrapper.
- Every folder of test modules has an ``__init__.py``: pytest names a module by its package
  path, and two folders' ``test_health.py`` would otherwise clash.
"""
