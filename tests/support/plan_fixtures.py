"""Inventories built directly from the model (no loader) for the pure plan tests."""
from bootstrap.model import Cluster, Host, Inventory, Ports, Secret, SSHTarget


def host(name, ip, role="worker", gpus=8, env=()):
    return Host(name=name, ssh=SSHTarget(address=ip), ip=ip, role=role, gpus=gpus, env=tuple(env))


def gpu_inventory(**cluster):
    # runtime ray: a cluster as `up` settles it for an image with Ray
    c = dict(name="llama", image="vllm/vllm-openai:v0.8.5", accelerator="gpu", runtime="ray",
             hf_cache="/data/hf", env=(("NCCL_DEBUG", "WARN"),))
    c.update(cluster)
    hosts = (
        host("gpu-a", "10.10.0.11", "head", env=(("NCCL_DEBUG", "WARN"), ("NCCL_SOCKET_IFNAME", "ens5"))),
        host("gpu-b", "10.10.0.12", env=(("NCCL_DEBUG", "WARN"), ("NCCL_SOCKET_IFNAME", "ens6"))),
    )
    return Inventory(path="mem.yaml", cluster=Cluster(**c), hosts=hosts)


def cpu_inventory(n=3, **cluster):
    c = dict(name="sandbox", image="172.31.240.2:5000/bootstrap/vllm-cpu:abc", accelerator="none", runtime="ray",
             ipc_host=False, shm_size="1g", ports=Ports())
    c.update(cluster)
    hosts = tuple(host(f"node{i + 1}", f"172.31.240.{11 + i}", "head" if i == 0 else "worker", None,
                       env=(("GLOO_SOCKET_IFNAME", "eth0"),)) for i in range(n))
    return Inventory(path="mem.yaml", cluster=Cluster(**c), hosts=hosts)


SECRET = Secret("HF_TOKEN", "hf_SUPERSECRETVALUE")
