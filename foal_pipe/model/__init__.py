"""A learned model: the scikit-learn estimators (classifier, projection), the model file, the deployed model and
prediction."""
