"""Stage 6, verified discovery: a few planned nccl-tests runs (or a measurement directory) against
the model's expectation give a verdict per host - healthy, degraded or failed, with the suspect GPU,
GPU pair or NIC rail - that operators gate hosts on. Without a model, pairwise node sweeps
(``sweeps``) are compared with their peers (``pairwise``): slow nodes, slow links, slow rails."""
