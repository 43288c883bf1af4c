"""Whole runs on one machine: a local swarm of peer processes (`swarm up`), the in-process
simulation (`swarm simulate`) with its optional chain recorder, and the run report."""
