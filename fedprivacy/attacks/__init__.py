"""Attacks that show what the protections defend against, and an audit of the claimed epsilon.

- :mod:`fedprivacy.attacks.gradient_leakage`: DLG, iDLG, Inverting Gradients and the analytic inversion
  of a dense layer, run by an honest-but-curious server on one client's update, against no defence,
  clipping, clipping + Gaussian noise, a client's share of distributed-DP noise and a secure-aggregation
  sum.
- :mod:`fedprivacy.attacks.membership`: loss-threshold and LiRA membership inference against the
  federated global model (with and without DP).
- :mod:`fedprivacy.attacks.released`: membership inference against a released (saved) global model, at
  example and user level, with reference-calibrated attacks and the split floor (the curve's own models).
- :mod:`fedprivacy.attacks.audit`: epsilon lower bounds from attack success (Clopper-Pearson; one-run
  audit with canaries) for the Gaussian mechanism and the DP-FedAvg aggregation.
- :mod:`fedprivacy.attacks.metrics`: PSNR, SSIM, MSE, label accuracy, ROC/AUC, TPR at low FPR, with
  bootstrap intervals and permutation p-values (``roc_summary``).

Submodules are imported on demand (torch is loaded only when a model is trained or evaluated).
"""
