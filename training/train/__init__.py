"""Training with Composer: configs (config_io.py), what a run decides from its data (calibration.py), the
Composer model and metrics, the optimizer, FSDP (parallelize.py), loggers and callbacks, the trainer
(build and run only: trainer.py) and multi-process launch (launch.py, launch_command.py)."""
