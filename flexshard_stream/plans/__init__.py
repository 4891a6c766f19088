"""The plan model: the cluster (``Topology``), the tables (``EmbeddingTable``, table files and
sizing), the one ``Plan`` type with its routing and files, and ``PlanDelta`` between two plans.
Imports ``sources``, ``stats`` and below.
"""
