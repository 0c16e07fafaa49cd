"""The learner's maths, written once against the array API: statistics, gamma paths, engines, the projection's
arithmetic, scoring and metrics. No file I/O and no scikit-learn here (its estimators live in :mod:`foal_pipe.model`)."""
