"""BandPilot on a Slurm cluster: configuration from what was measured (``slurm.conf`` node lines,
``gres.conf`` with per-GPU ``Links=``, ``topology.conf``), the dispatcher's state read from Slurm
(allocated GPU indices, drained and down nodes), and draining nodes a ``verify`` found slow.

Every module talks to Slurm through its own commands (``scontrol``, ``squeue``, ``sinfo``) via
:mod:`bandpilot.integrations.slurm.commands`, so one place turns "not installed" / "not answering"
into a one-line error.
"""
