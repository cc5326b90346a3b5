"""tmp"""
from sapptk.calibration.fitting import Calibration, calibrate
from sapptk.calibration.observations import DryRuns, read_calibration_yaml, read_observations
