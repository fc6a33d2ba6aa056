"""Integration tests of vllmctl: the real binary against a real vllmd (and vllm-ref-engine).

Run through CTest (`ctest -R integration_vllmctl`), which sets VLLMCTL_BIN, VLLMD_BIN,
VLLM_REF_ENGINE_BIN and PYTHONPATH (../support, the shared harness); otherwise set those and run
`python3 -m unittest -v test_vllmctl` from this directory. The cases live in cases_*.py, one
theme each; importing them here makes this one module the suite.
"""

from cases_cli import *  # noqa: F401,F403
from cases_commands import *  # noqa: F401,F403
from cases_errors import *  # noqa: F401,F403
from cases_example import *  # noqa: F401,F403
from cases_fleet import *  # noqa: F401,F403
from cases_sync import *  # noqa: F401,F403
from cases_wire import *  # noqa: F401,F403
