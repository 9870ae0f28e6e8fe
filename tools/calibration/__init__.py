"""Calibration of the comparison's verdicts on synthetic runs with known truth.

tools/calibrate.py is its command line. Modules, in the order a row flows through them:

- :mod:`.model`: the synthetic run (variants, primaries, the noise model) and one trial's draw;
- :mod:`.stopping`: sequential designs, the runner's stopping rule replayed on a trial;
- :mod:`.trials`: each trial judged by the comparison code, the verdicts counted per row;
- :mod:`.designs`: one invocation's CV rows, repeat search and design table, with their cost;
- :mod:`.tables`: the printed tables and the targets' verdict.
"""
