"""The cost model: predicts how fast a schedule runs from its scheduled loop nest, without building or timing it.

features.py (MetaSchedule's per-store features of a scheduled module) -> model.py (XGBoost trained on the
measured corpus; save/load; `choose` among a one-pass schedule and its samples) -> command.py (`tensorlang
cost-model`). Policy `tlm-ranked:K` (baselines/tlm.py) keeps the model's candidate this ranks first.
"""
