"""The search and its pricing: execution profiles, the one cost evaluator, the baselines, the
FlexShard planner in stages (candidates, partition, pricing), the RecShard host tier and TorchRec's
own plan as a priced reference. Imports ``bridge``, ``plans`` and below.
"""
