"""N replicas behind vllm-router: the pure plan and serve/status/rollout/stop over SSH."""
