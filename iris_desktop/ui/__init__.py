"""The Qt user interface: widgets and workers only; all logic lives in ``iris_desktop.core``."""
