"""Privacy/utility sweeps: the grid, its runner, the summary table and the plots.

`grid` (run specs, configs, sweep.json), `runner` (trains each run in its own
process), `summary` (results.json -> table rows), `plots` (figures) and
`report` (table + figures). Apps: `python -m dpnmt.sweep`, `python -m dpnmt.report`.
"""
