"""The study of runs, apart from the algorithm: evaluation statistics and tables (stats.py), result
folders (results.py) and their tables (tables.py), a run's HTML report (runreport.py), ScalingInter
horizon studies (horizons.py), task screening (screen.py), the finite-demonstrations protocol (protocol.py,
run as resumable pieces: pieces.py), and their command line (report.py).
Everything here reads the files that train.py and evaluate.py write; nothing outside lab/ imports it,
except evaluate.py, which measures with stats.py. Run its commands from the repository's root:
`python -m lab.report results/NAME`."""
