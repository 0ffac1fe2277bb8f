"""Stage 4, surrogate -> assignment: cluster state, the contention-aware predictor ``B(S, tau)``,
the candidate searches (count-vector exact, EHA, PTS) and baselines behind one
:class:`~bandpilot.dispatch.dispatcher.Dispatcher`. Hands the queue and evaluation a GPU subset."""
