"""Wall-clock proof on an emulated cluster: exported plans run in a real TorchRec
``DistributedModelParallel`` across network namespaces shaped with ``tc`` (docs/CLUSTER.md).
Imports ``placement`` and below (floor 7, beside ``online``)."""
