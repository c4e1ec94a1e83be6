"""Benchmarks for fedprivacy: privacy modes side by side with Flower's own tools.

Entry point: ``scripts/benchmark.py``. This package holds the pieces it runs:

- ``benchmarks.spec``: one benchmark configuration (``BenchSpec``) and its result row;
- ``benchmarks.task``: data, partitions, model and local training shared by every runner, so that
  fedprivacy, the Flower baselines and the torch loop train the same model on the same clients;
- ``benchmarks.flower_baselines``: Flower-native ServerApp/ClientApp pairs (plain FedAvg, central DP
  with client-side fixed clipping, SecAgg+ with central DP) run on Flower's simulation engine;
- ``benchmarks.torch_loop``: a single-process torch loop doing the same local training, no Flower;
- ``benchmarks.fedprivacy_runner``: fedprivacy's own apps on the in-process engine or on Ray;
- ``benchmarks.worker``: runs one spec in a fresh process (so peak memory is per configuration);
- ``benchmarks.report``: ratios, the markdown table, plots and the machine description.
"""
