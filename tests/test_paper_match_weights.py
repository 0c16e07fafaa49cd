"""A run compared with the paper's Table 2 names a fusion without the final norm and weights other than the
backbone's published ones as differences (the paper's fusion normalises the block average once, with
``vit_base_patch16_224.augreg2_in21k_ft_in1k``'s own weights)."""

from __future__ import annotations

from helpers import PAPER_ENCODER
from test_evaluate import paper_metrics

from foal_pipe.report.paper import match_paper


def test_a_fusion_without_the_final_norm_is_not_the_papers():
    encoder = dict(PAPER_ENCODER, fusion="mean-cls", final_norm="not applied (--no-fusion-norm)")
    match = match_paper(paper_metrics(encoder=encoder))
    assert match.differences == ("final norm not applied (--no-fusion-norm) (paper: applied once to the block "
                                 "average)",)
    applied = dict(PAPER_ENCODER, fusion="mean-cls", final_norm="applied once to the block average")
    assert match_paper(paper_metrics(encoder=applied)).comparable


def test_weights_other_than_the_published_ones_are_not_the_papers():
    for source in ("checkpoint", "random"):
        encoder = dict(PAPER_ENCODER, weights={"source": source})
        match = match_paper(paper_metrics(encoder=encoder))
        assert match.differences == (f"weights from {source} (paper: vit_base_patch16_224.augreg2_in21k_ft_in1k's "
                                     "published weights)",)
    for source in ("hf-hub", "url"):
        assert match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, weights={"source": source}))).comparable
    assert match_paper(paper_metrics(encoder=dict(PAPER_ENCODER, weights={"source": "checkpoint"})),
                       ignore=("encoder",)).comparable
