"""Stage 1, where bandwidth comes from: measured tables (:class:`TraceFabric`), the calibrated
emulator (:class:`EmulatorFabric`) and its calibration. Hands profiling and evaluation a
``Fabric`` that answers ``bandwidth(allocation)``."""
