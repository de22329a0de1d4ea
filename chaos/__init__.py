"""Fault injection for herd: worker processes, a provider simulator, faults on a schedule.

``chaos.harness.run_chaos`` runs one bounded run against PostgreSQL or Redis and
``chaos.checker.check`` reads what is left in the job store, the fenced result
tables, the workers' side logs and the simulator's per-call records, and names
every broken guarantee. ``python -m chaos --help`` runs one from the shell.
"""
