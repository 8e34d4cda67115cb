"""serve: the split and launch plan (pure), the launch over SSH, and the `bench` load generator."""
