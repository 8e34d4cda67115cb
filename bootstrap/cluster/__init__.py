"""The cluster: facts, the pure plan of `up`, Ray, the image, and up/status/down/exec over SSH."""
