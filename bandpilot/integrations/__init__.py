"""Bridges between BandPilot and the schedulers operators already run (Slurm)."""
