"""Benchmarks for fedprivacy: privacy modes side by side with Flower's own tools.

Entry point: ``scripts/benchmark.py``. This package holds the pieces it runs:

- ``fedprivacy_bench.spec``: one benchmark configuration (``BenchSpec``) and its result row;
- ``fedprivacy_bench.task``: data, partitions, model and local training shared by every runner, so that
  fedprivacy, the Flower baselines and the torch loop train the same model on the same clients;
- ``fedprivacy_bench.flower_baselines``: Flower-native ServerApp/ClientApp pairs (plain FedAvg, central DP
  with client-side fixed clipping, SecAgg+ with central DP) run on Flower's simulation engine;
- ``fedprivacy_bench.torch_loop``: a single-process torch loop doing the same local training, no Flower;
- ``fedprivacy_bench.fedprivacy_runner``: fedprivacy's own apps on the in-process engine or on Ray;
- ``fedprivacy_bench.worker``: runs one spec in a fresh process (so peak memory is per configuration);
- ``fedprivacy_bench.report``: ratios, the markdown table, plots and the machine description.
"""
