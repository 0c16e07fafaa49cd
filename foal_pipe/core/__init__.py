"""The learner's maths, written once against the array API: statistics, gamma paths, engines, projection,
scoring and metrics. No file I/O here."""
