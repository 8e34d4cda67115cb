"""Sample lines for every signature, and for every pattern in it: a log line as the tool prints it.

Data, used twice: tests/doctor/test_signature_samples.py checks that each sample yields its signature
(and that every pattern is matched by one of them), and the documentation's troubleshooting page
(docs/hooks.py) shows the first sample of each signature as what the user sees. Most are taken from
the excerpts in tests/data/logs (named in the comments) or from tests/doctor/test_signatures.py;
the rest are built from the message text in the source a signature names (`Signature.sources`) and
say so.
"""
from __future__ import annotations

SAMPLES: dict[str, tuple[str, ...]] = {
    "ray-ip-mismatch": (
        "Error: No available node types can fulfill resource request {'node:10.61.0.27': 0.001, 'GPU': 1.0}",
        # ray-ip-mismatch__3.log, with its colour codes
        "\x1b[33m(autoscaler +21m12s)\x1b[0m Error: No available node types can fulfill resource request "
        "{'node:10.2.0.127': 0.001, 'GPU': 1.0}. Add suitable node types to this cluster to resolve this issue.",
    ),
    "ray-driver-no-gpu": (
        # ray-driver-no-gpu__1.log, the resource dict cut short
        "ValueError: Current node has no GPU available. current_node_resource={'memory': 803011488768.0, "
        "'node:__internal_head__': 1.0, 'accelerator_type:A100': 1.0}",
    ),
    "placement-group-wait": (
        # placement-group-wait__2.log
        "INFO 04-01 02:46:00 ray_utils.py:214] Waiting for creating a placement group of specs for 10 seconds. "
        "specs=[{'node:10.163.194.101': 0.001, 'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` to see if you have "
        "enough resources.",
        "NING 04-01 02:45:50 ray_utils.py:320] The number of required GPUs exceeds the total number of available "
        "GPUs in the placement group.",
        # built from vllm/executor/ray_utils.py (_wait_until_pg_ready)
        "ValueError: Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0, 'node:10.0.0.1': "
        "0.001}, {'GPU': 1.0}] within 1800 seconds. See `ray status` and `ray list nodes` to make sure the "
        "cluster has enough resources.",
        # Ray's autoscaler for a request without a node: IP
        "(autoscaler +1m3s) Error: No available node types can fulfill resource request {'CPU': 1.0, 'GPU': 1.0}. "
        "Add suitable node types to this cluster to resolve this issue.",
        # test_signatures.py (test_ray_scheduler_warning_counts_only_for_gpu_requests)
        "(autoscaler +2s) Warning: The following resource request cannot be scheduled right now: {'GPU': 1.0, "
        "'CPU': 1.0}. This is likely due to all cluster resources being claimed by actors.",
        # the title of vllm-project/vllm#30061
        "(APIServer pid=1) Value error, Tensor parallel size (2) cannot be larger than the number of available "
        "GPUs (1).",
    ),
    "ray-gcs-unreachable": (
        # ray-gcs-unreachable__2.log, __1.log
        "[2025-02-16 16:05:55,537 E 350061 350061] gcs_rpc_client.h:179: Failed to connect to GCS at address "
        "172.23.15.13:20000 within 5 seconds.",
        "[2025-07-23 10:06:19,681 W 51000 51000] gcs_client.cc:183: Failed to get cluster ID from GCS server: "
        "TimedOut: Timed out while waiting for GCS to become available.",
        # built from ray's gcs_rpc_client.h (RAY_LOG(FATAL) in its reconnect loop)
        "[2024-03-02 11:20:41,112 C 812 812] gcs_rpc_client.h:554: Couldn't reconnect to GCS server. The last "
        "attempted GCS server address was 10.0.0.1:6379",
    ),
    "ray-missing": (
        "/bin/sh: 1: ray: not found",  # ray-missing__2.log
        "ERROR: init 250 result=11/bin/bash: line 1: ray: command not found",  # ray-missing__3.log
        "ModuleNotFoundError: No module named 'ray'",
        # ray-missing__1.log
        "WARNING 05-15 15:13:52 ray_utils.py:46] Failed to import Ray with ModuleNotFoundError(\"No module named "
        "'ray'\"). For multi-node inference, please install Ray with `pip install ray`.",
        # docker run of a Ray-less image with `ray start` as its command
        "docker: Error response from daemon: failed to create task for container: failed to create shim task: "
        "OCI runtime create failed: runc create failed: unable to start container process: exec: \"ray\": "
        "executable file not found in $PATH: unknown.",
        # older vLLM's initialize_cluster (vllm/engine/ray_utils.py)
        "ImportError: Ray is not installed. Please install Ray to use distributed serving.",
    ),
    "cpu-ray-unsupported": (
        "ValueError: current platform cpu does not support ray.",  # cpu-ray-unsupported__1.log
    ),
    "gpu-not-visible": (
        # gpu-not-visible__3.log, __2.log, __1.log
        "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].",
        "RuntimeError: Failed to infer device type",
        "INFO 05-14 04:44:35 [__init__.py:243] No platform detected, vLLM is running on UnspecifiedPlatform",
        # the banner of NVIDIA's CUDA images started without GPUs
        "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available.",
        # checks/cuda_probe.py on an H200 with the GPU hidden (tests/data/gpu/h200-cuda-probe.txt)
        '{"torch": "2.11.0+cu130", "cuda": "13.0", "devices": 0, "visible": "0", "error": "RuntimeError: No CUDA '
        'GPUs are available"}',
        # a container started without --gpus (github.com/kcosta42/VQGAN-CLIP-Docker/issues/1)
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
        "installed a driver from http://www.nvidia.com/Download/index.aspx",
    ),
    "cuda-fabric-manager": (
        # torch on an H200 whose Fabric Manager never completed (github.com/huggingface/huggingface_hub/issues/4134)
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized",
        # torch before 1.9 (github.com/pytorch/pytorch/issues/35710)
        "RuntimeError: cuda runtime error (802) : system not yet initialized at "
        "/opt/conda/conda-bld/pytorch_1579022034529/work/aten/src/THC/THCGeneral.cpp:50",
        # CUDA's bandwidthTest sample, same issue
        'CUDA error at bandwidthTest.cu:256 code=802(cudaErrorSystemNotReady) "cudaSetDevice(currentDevice)"',
    ),
    "gloo-loopback": (
        # gloo-loopback__2.log, __1.log
        "[rank7]:[W806 14:25:27.650991133 ProcessGroupGloo.cpp:524] Warning: Unable to resolve hostname to a "
        "(local) address. Using the loopback address as fallback. Manually set the network interface to bind to "
        "with GLOO_SOCKET_IFNAME. (function operator())",
        "(RayWorkerWrapper pid=1890, ip=10.41.0.8) [rank8]:[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh "
        "failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
        # Gloo's enforce failing in a pair's read (torch.distributed on a mismatched peer)
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 881392 vs 4",
    ),
    "socket-ifname-missing": (
        "Bootstrap : no socket interface found",  # socket-ifname-missing__1.log
        # socket-ifname-missing__4.log, __3.log, __2.log
        "node-b:4711:4711 [0] bootstrap.cc:108 NCCL WARN NET/Socket : No usable listening interface found",
        "  ifa != nullptr. Unable to find address for: ^lo",
        "[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
        "AF_INET6(10)",
    ),
    "nccl-ib-no-device": (
        "ae05277d311f:55933:55933 [1] NCCL INFO NET/IB : No device found.",  # nccl-ib-no-device__1.log
        # NCCL's line when the image has no rdma-core (as in NVIDIA/nccl#1410)
        "h100-node-1:2340:2384 [4] NCCL INFO Failed to open libibverbs.so[.1]",
    ),
    "nccl-socket-with-ib": (
        # nccl-socket-with-ib__1.log, clean__nccl_single_node.log, nccl-ib-no-device__2.log,
        # nccl-socket-with-ib__2.log
        "[0] node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
        "bm-22075ry:1259:1259 [0] NCCL INFO Using network Socket",
        "instance-8g-96c-2:525781:525957 [0] NCCL INFO NET/Socket : Using [0]ens7:10.128.0.31<0>",
        "sinnet:868106:868152 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.",
    ),
    "nccl-shm": (
        # nccl-shm__1.log, test_signatures.py (the sandbox's vLLM CPU log)
        "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-xxxxx (size 7340384)",
        "RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 MiB required, 64 MiB "
        "free. Increase /dev/shm (e.g. --shm-size or --ipc=host).",
        # a native backtrace frame (gdb, py-spy --native) in NCCL's shared-memory helper (src/misc/shmutils.cc)
        "#2  0x00007f3c1c8a1e2f in ncclShmOpen(char*, unsigned long, unsigned long, void**, void**, int, void**) "
        "() from /usr/local/lib/python3.10/dist-packages/nvidia/nccl/lib/libnccl.so.2",
    ),
    "nccl-unhandled-system-error": (
        # nccl-unhandled-system-error__2.log (two lines), __3.log
        "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:839, unhandled system error, NCCL "
        "version 2.8.3",
        "ncclSystemError: System call (socket, malloc, munmap, etc) failed.",
        "ERROR 06-13 07:35:59 [core.py:517] cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_SYSTEM_ERROR: "
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    ),
    "nccl-env-overwritten": (
        # nccl-env-overwritten__2.log (two lines)
        "(RayWorkerWrapper pid=20612, ip=10.0.1.12) WARNING 07-11 09:57:11 [__init__.py:733] Overwriting "
        "environment variable NCCL_SOCKET_IFNAME from 'ens2f1' to 'ens1f0'",
        "INFO 07-11 09:57:11 [ray_distributed_executor.py:355] Copying the following environment variables to "
        "workers: ['LD_LIBRARY_PATH', 'NCCL_SOCKET_IFNAME', 'VLLM_USE_RAY_SPMD_WORKER', "
        "'VLLM_USE_RAY_COMPILED_DAG', 'VLLM_USE_V1']",
    ),
    "cuda-oom": (
        # cuda-oom__2.log, cut after the allocator's figures
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 160.00 MiB (GPU 0; 79.35 GiB total "
        "capacity; 78.58 GiB already allocated; 145.19 MiB free; 78.58 GiB reserved in total by PyTorch)",
        # a CUDA call failing (torch's CUDA error wording)
        "RuntimeError: CUDA error: out of memory",
    ),
    "port-in-use": (
        "OSError: [Errno 98] Address already in use",  # port-in-use__1.log (two lines)
        "RuntimeError: The server socket has failed to listen on any local network address. useIpv6: 0, code: "
        "-98, name: EADDRINUSE, message: address already in use",
    ),
    "hf-auth": (
        # hf-auth__1.log (two lines), hf-auth__2.log
        "OSError: You are trying to access a gated repo.",
        "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/resolve/main/"
        "config.json.",
        "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/"
        "meta-llama/Llama-2-7b-chat-hf/resolve/main/tokenizer_config.json",
        "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
        # huggingface_hub's RepositoryNotFoundError detail line (a private repo without a token)
        "Repository Not Found for url: https://huggingface.co/api/models/meta-llama/Llama-2-7b-hf/revision/main.",
    ),
    "disk-full": (
        # disk-full__2.log, test_signatures.py
        "failed to register layer: Error processing tar file(exit status 1): write file : no space left on device",
        "OSError: [Errno 28] No space left on device: '/root/.cache'",
        # an I/O error of a Rust downloader (hf_transfer, hf-xet) in Debug form
        "Error: Os { code: 28, kind: StorageFull, message: \"No space left on device\" }",
    ),
    "tp-heads-indivisible": (
        # test_signatures.py, tp-heads-indivisible__4.log
        "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).",
        "    assert self.total_num_kv_heads % tp_size == 0",
        "(Worker_TP0 pid=212)     self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)",
        # the code lines of vllm/model_executor/models/llama.py and layers/linear.py in a traceback
        "    assert tp_size % self.total_num_kv_heads == 0",
        "    self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)",
    ),
    "pp-invalid": (
        # pp-invalid__1.log, __2.log (the list of architectures cut short), test_signatures.py, pp-invalid__3.log
        "NotImplementedError: Pipeline parallelism is not supported for this model. Supported models implement "
        "the `SupportsPP` interface.",
        "NotImplementedError: Pipeline parallelism is only supported for the following  architectures: "
        "['AquilaForCausalLM', 'AquilaModel', 'DeepseekV2ForCausalLM', 'GPT2LMHeadModel']",
        "ValueError: Total number of hidden layers (30) must be divisible by pipeline parallel size (4).",
        "ValueError: len(partitions)=3 does not match pp_size=2.",
        "(EngineCore_DP0 pid=6183) ERROR 11-24 22:55:35 [core.py:1510] ValueError: sum(partitions)=30 does not "
        "match num_hidden_layers=32.",
    ),
    "max-model-len-too-long": (
        # max-model-len-too-long__1.log
        "ValueError: User-specified max_model_len (131072) is greater than the derived max_model_len (None=8192 "
        "in model's config.json). This may lead to incorrect model",
    ),
    "vllm-bad-argument": (
        # test_signatures.py (test_root_cause_of_a_refused_command_line_is_vllms_usage_error): the sandbox's vLLM
        "vllm: error: unrecognized arguments: --no-such-vllm-flag",
        # built from argparse's error format for a bad value
        "vllm serve: error: argument --max-model-len: invalid human_readable_int value: 'lots'",
    ),
    "kv-cache-too-small": (
        # built from vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory)
        "(EngineCore_DP0 pid=18799) ERROR 10-08 20:33:48 [core.py:708] ValueError: To serve at least one request "
        "with the models's max seq len (40960), (5.62 GiB KV cache is needed, which is larger than the available "
        "KV cache memory (4.50 GiB). Based on the available memory, the estimated maximum model length is 32768.",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
    ),
    "worker-illegal-instruction": (
        # built from vllm/v1/executor/multiproc_executor.py: an eager DP engine on the sandbox before the AMX fix
        "(EngineCore_DP1 pid=412) ERROR 11-27 22:07:37 [multiproc_executor.py:316] Worker proc VllmWorker-0 died "
        "unexpectedly (exit code: -4), shutting down executor.",
        # the sandbox image before the AMX fix: an eager LLM.generate under python -X faulthandler (2026-11-27)
        "Fatal Python error: Illegal instruction",
    ),
    "serve-container-exited": (
        # checks/keeper.py, as the sandbox fleet's kill test prints it
        "keeper: bootstrap-vllm-serve was Exited (137) 3 seconds ago: started (204)",
    ),
    "secret-gone": (
        # secret-gone__sandbox_reboot.log (cluster/guard/secretstore.py's entrypoint)
        "bootstrap: the secret HF_TOKEN is not on this host (/run/bootstrap is on a tmpfs: a reboot empties it): "
        "run bootstrap up (and bootstrap serve) again to put it back",
    ),
    "vip-image-lacks-keepalived": (
        # checks/vip_entry.sh in an image without keepalived (tests/fleet/test_vip.py runs it)
        "bootstrap: keepalived is not in this image (cluster.router.vip.image)",
    ),
    "vip-router-unready": (
        # keepalived 2.2.7 on a sandbox router host, its router paused (docker pause)
        "Fri Nov 27 03:19:35 2026: VRRP_Script(router_health) failed (exited with status 28)",
    ),
}
