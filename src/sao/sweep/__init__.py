"""Seeded sweeps: a grid of arms x seeds over one base run config, run and reported (`sao sweep`,
`sao report`, `sao compare`).

`spec` reads the YAML spec, `execute` runs the planned runs (a bounded number at once, restartable),
`aggregate` puts a sweep's runs on common axes, `finals` reduces each run to its final metrics and
compares arms, `stats` holds the bootstrap intervals and permutation tests, and `report` writes the curves,
tables and the list of every run.
"""
