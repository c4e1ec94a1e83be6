"""Sweeps of run configs x seeds: the sweep file, its results table and its figures.

The runner that starts the runs is :mod:`server.engine.sweep` (it needs the Flower apps); this
package is the pure part: :mod:`.spec` (the file, the plan, the config hash), :mod:`.table` (one row
per run, CSV and Markdown over seeds) and :mod:`.curves` (accuracy against ε and against rounds, the
same code that draws docs/BENCHMARKS.md).
"""
