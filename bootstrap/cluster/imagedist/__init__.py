"""Image distribution: getting the cluster image onto every node (pulls, a registry mirror, --load-image, peer copies).

plan.py holds the decisions and the commands (pure), run.py runs them over SSH. See
docs/image-distribution.md.
"""
