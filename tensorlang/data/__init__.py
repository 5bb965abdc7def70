"""Workload data. Extraction from real models: `extract` (the pipeline and the manifest), `translate`
(TensorIR PrimFunc -> .tsched operator), `verify` (the numerical round-trip check), `models` (configs)."""
