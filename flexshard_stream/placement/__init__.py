"""Where rows live and what that costs: topology, tables, the one ``Plan`` type, baselines, the one
cost evaluator, the FlexShard planner in stages, the RecShard host tier, plan deltas, and TorchRec
estimates and export. Imports ``sources``, ``stats`` and below.
"""
