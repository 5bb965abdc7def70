"""Workloads from real models, the measured dataset and the pre-training corpus."""
