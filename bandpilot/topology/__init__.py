"""Stage 0, what the cluster is: the cluster spec (YAML, ``nvidia-smi topo -m``) and the
nccl-tests log format. Hands every later stage a :class:`~bandpilot.topology.cluster.ClusterSpec`
and parsed measurements."""
