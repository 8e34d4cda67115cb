"""The guard wing of the cluster: the fence, Ray's token and the secrets (pure modules, and run.py over SSH).

What keeps strangers off the cluster's ports and its secrets out of Docker's records. The pure modules
decide: fence.py (the fence's ports and rules, Ray's token, what a host exposes), allow.py (the bound on
cluster.fence_allow), secretstore.py (where secrets live on a host and how a container gets them),
fencedoc.py (docs/security.md's fence table); run.py applies them over SSH. This face imports nothing,
so importing a pure module of the wing pulls in no I/O.
"""
