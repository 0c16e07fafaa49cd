"""A learned model: the scikit-learn classifier, its model file, the deployed model and prediction."""
