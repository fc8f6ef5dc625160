"""Compiled kernels (built from pyx/). Importing any of them goes through this file first.

OpenMP threads that wait at a barrier sleep instead of spinning: the cores are shared (other
processes, the event loop), and a spinning waiter that gets descheduled costs a whole time
slice. libgomp reads the policy once, when the first kernel module loads it, so it is set
here; an explicit OMP_WAIT_POLICY in the environment wins.
"""
import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["LLMCORE_SET_OMP_WAIT_POLICY"] = "1"  # so child processes can tell it was us
