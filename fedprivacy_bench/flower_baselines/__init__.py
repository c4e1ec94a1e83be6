"""Flower-native baselines, measured in the same run as fedprivacy.

- ``message_api``: Flower 1.42 Message API apps: plain ``FedAvg`` and ``FedAvg`` wrapped in
  ``DifferentialPrivacyClientSideFixedClipping`` (+ ``fixedclipping_mod`` on the client) with
  Flower's RDP accountant (which, in 1.42, accepts only ``no-amplification`` sampling).
- ``secaggplus``: Flower's ``SecAggPlusWorkflow`` + ``secaggplus_mod`` with central DP
  (legacy ``DifferentialPrivacyClientSideFixedClipping``). It only runs through the legacy API
  (``LegacyContext``, ``NumPyClient``); that is acceptable here because it is the peer being
  measured, not fedprivacy's code.
- ``run``: runs either on Flower's simulation engine (``flwr.simulation.run_simulation``, Ray) and
  returns the benchmark record.

These apps are built from a ``BenchSpec`` by factories because ``run_simulation`` takes no run
config; they use the same data, partitions, model and local SGD as every other row
(``fedprivacy_bench.task``).
"""
