"""The learners of the one walk (:func:`~foal_pipe.protocol.walk.walk`), one module each: ridge's Gram lanes with
the gamma path, leave-one-out, kept activations, Dask sums and anytime points (:mod:`.gram`); the rls engine's
batch-by-batch replay (:mod:`.rls`); the registry heads' running states (:mod:`.heads`)."""
