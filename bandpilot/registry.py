"""Import path kept for models registered by BandPilot 0.1: MLflow cloudpickled their pyfunc
wrapper by reference as ``bandpilot.registry.SurrogatePyfunc``; unpickling needs this name."""

from bandpilot.model.pyfunc import SurrogatePyfunc

__all__ = ["SurrogatePyfunc"]
