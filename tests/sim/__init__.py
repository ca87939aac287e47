"""A deterministic simulation of format 3 (issue 32): the real committer, maintenance, views and
reader over a simulated store, every actor and fault chosen by one seed.

Run it as its own process (``python -m tests.sim``; ``make simulate``): it patches the
process's clock, ids and hidden threads (``tests.sim.determinism``). docs/design/simulation.md
says how it works, what it checks and what it does not cover yet.
"""
