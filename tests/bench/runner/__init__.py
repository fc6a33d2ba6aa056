"""The parts of tests/bench/run.py: common, procs, rig, scenarios, report."""
