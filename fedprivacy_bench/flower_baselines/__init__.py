"""Flower-native baselines, measured in the same run as fedprivacy.

- ``message_api``: Flower 1.42 Message API apps: plain ``FedAvg`` and ``FedAvg`` wrapped in
  ``DifferentialPrivacyClientSideFixedClipping`` (+ ``fixedclipping_mod`` on the client) or, with the
  spec option ``flower_clipping="server"``, ``DifferentialPrivacyServerSideFixedClipping``, with
  Flower's RDP accountant (which, in 1.42, accepts only ``no-amplification`` sampling).
- ``momentum_noise``: what those wrappers release around a server optimizer (``FedAvgM``): noise
  correlated over rounds (docs/DESIGN.md), hence FedAvg-only Flower rows.
- ``secaggplus``: Flower's ``SecAggPlusWorkflow`` + ``secaggplus_mod`` with central DP
  (legacy ``DifferentialPrivacyClientSideFixedClipping``). It only runs through the legacy API
  (``LegacyContext``, ``NumPyClient``); that is acceptable here because it is the peer being
  measured, not fedprivacy's code.
- ``run``: runs either on Flower's simulation engine (``spec.engine="ray"``:
  ``flwr.simulation.run_simulation``) or on fedprivacy's in-process engine (``"inprocess"``:
  ``server.engine.run_inprocess`` given the same app objects; Flower's strategies, mods and
  accountant unmodified) and returns the benchmark record.

These apps are built from a ``BenchSpec`` by factories because ``run_simulation`` takes no run
config; they use the same data, partitions, model and local SGD as every other row
(``fedprivacy_bench.task``).
"""
