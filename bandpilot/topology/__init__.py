"""Stage 0, what the cluster is: the cluster spec (YAML, ``nvidia-smi topo -m``) and nccl-tests
logs (parsed and written). Hands every later stage a :class:`~bandpilot.topology.cluster.ClusterSpec`
and parsed measurements."""
