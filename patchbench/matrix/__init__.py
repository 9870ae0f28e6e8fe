"""A matrix of whole A/B runs ("units"), one after another here or as Ray tasks on a cluster
(docs/scale-out.md). A unit is one whole ``bench`` run on one node: the arms of a comparison are
never split across machines.
"""
