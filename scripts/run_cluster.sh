#!/usr/bin/env bash
# Start one node of a vLLM Ray cluster by hand: the same container `bootstrap up` would start
# (tests/test_run_cluster_script.py holds the two together).
#
#   run_cluster.sh [options] IMAGE HEAD_IP --head|--worker [HF_HOME] [-- EXTRA_DOCKER_ARGS...]
#
# Options:
#   --node-ip IP        this node's data-plane IP, exported as VLLM_HOST_IP and given to Ray
#                       (default: HEAD_IP on the head, else the source IP of the route to HEAD_IP)
#   --name NAME         container name (default: bootstrap-vllm)
#   --cluster NAME      cluster label (default: vllm)
#   --gpus all|none     pass --gpus all (default) or no GPUs (CPU nodes)
#   --num-gpus N        the GPUs Ray may schedule on this node (default: what Ray counts itself)
#   --gcs-port PORT     Ray GCS port (default 6379); --dashboard-port PORT (default 8265)
#   --metrics-port PORT Ray's Prometheus metrics export on this node (default 8080)
#   --dashboard-host H  where the head's dashboard listens: localhost (default, 127.0.0.1),
#                       data-plane (the node IP), all (0.0.0.0) or an IP address
#   --nofile N          container nofile limit (default: this host's hard limit, at most 1048576)
#   --shm-size SIZE     use --shm-size SIZE instead of --ipc host
#   --infiniband        pass /dev/infiniband, IPC_LOCK and an unlimited memlock (no --privileged)
#   --privileged        run privileged (only if you really need it)
#   --no-ray            the container only holds the node (`sleep infinity`), for vLLM's native
#                       multi-node mode with images that do not ship Ray
#   -v SRC:DST[:ro]     extra mount (repeatable)
#   -e NAME=VALUE       environment for the node, e.g. -e NCCL_SOCKET_IFNAME=ens5 (repeatable)
#   --env-file FILE     secrets such as HF_TOKEN, kept off the command line
#   --foreground        stay attached (Ctrl-C removes the container); default: detached
#   --dry-run           print the docker command (one NUL-terminated argument each) and exit
set -euo pipefail

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "run_cluster.sh: $*" >&2; exit 2; }

name=bootstrap-vllm cluster=vllm gpus=all gcs_port=6379 dash_port=8265 metrics_port=8080 nofile="" shm=""
infiniband=0 privileged=0 foreground=0 dry_run=0 node_ip="" env_file="" no_ray=0 dash_host=localhost num_gpus=""
declare -a mounts=() extra=() positional=()
declare -A envs=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --node-ip) node_ip=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --cluster) cluster=${2:?}; shift 2 ;;
    --gpus) gpus=${2:?}; shift 2 ;;
    --num-gpus) num_gpus=${2:?}; shift 2 ;;
    --gcs-port) gcs_port=${2:?}; shift 2 ;;
    --dashboard-port) dash_port=${2:?}; shift 2 ;;
    --metrics-port) metrics_port=${2:?}; shift 2 ;;
    --dashboard-host) dash_host=${2:?}; shift 2 ;;
    --nofile) nofile=${2:?}; shift 2 ;;
    --shm-size) shm=${2:?}; shift 2 ;;
    --infiniband) infiniband=1; shift ;;
    --privileged) privileged=1; shift ;;
    --no-ray) no_ray=1; shift ;;
    -v) mounts+=("${2:?}"); shift 2 ;;
    -e) kv=${2:?}; [[ $kv == *=* ]] || die "-e wants NAME=VALUE, got '$kv'"; envs[${kv%%=*}]=${kv#*=}; shift 2 ;;
    --env-file) env_file=${2:?}; shift 2 ;;
    --foreground) foreground=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    *) positional+=("$1"); shift ;;
  esac
done

[[ ${#positional[@]} -ge 3 ]] || usage
image=${positional[0]} head_ip=${positional[1]} role_flag=${positional[2]} hf_home=${positional[3]:-}
case "$role_flag" in
  --head) role=head ;;
  --worker) role=worker ;;
  *) die "third argument must be --head or --worker, got '$role_flag'" ;;
esac
[[ $gpus == all || $gpus == none ]] || die "--gpus must be all or none"

if [[ -z $node_ip ]]; then
  if [[ $role == head ]]; then
    node_ip=$head_ip
  else
    node_ip=$(ip -o route get "$head_ip" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')
    [[ -n $node_ip ]] || die "cannot tell this node's IP on the way to $head_ip: pass --node-ip"
  fi
fi
if [[ -z $nofile ]]; then
  nofile=$(ulimit -Hn)
  if [[ $nofile == unlimited || $nofile -gt 1048576 ]]; then nofile=1048576; fi
fi
envs[VLLM_HOST_IP]=$node_ip
# PyTorch's and vLLM's compile caches on a volume per host that outlives the container, so a restart
# does not compile again (bootstrap.cluster.plan.COMPILE_ENV); an -e of the same name wins.
cache=/var/cache/bootstrap-compile
for kv in "TORCHINDUCTOR_CACHE_DIR=$cache/inductor" "TRITON_CACHE_DIR=$cache/triton" "VLLM_CACHE_ROOT=$cache/vllm"; do
  [[ -v "envs[${kv%%=*}]" ]] || envs[${kv%%=*}]=${kv#*=}
done
case "$dash_host" in
  localhost) dash_host=127.0.0.1 ;;
  data-plane) dash_host=$node_ip ;;
  all) dash_host=0.0.0.0 ;;
esac

hostport() { if [[ $1 == *:* ]]; then echo "[$1]:$2"; else echo "$1:$2"; fi; }

args=(docker run -d --name "$name" --network host)
if [[ -n $shm ]]; then args+=(--shm-size "$shm"); else args+=(--ipc host); fi
[[ $gpus == all ]] && args+=(--gpus all)
args+=(--ulimit "nofile=$nofile:$nofile")
[[ $infiniband == 1 ]] && args+=(--device /dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1:-1)
[[ $privileged == 1 ]] && args+=(--privileged)
[[ -n $hf_home ]] && args+=(-v "$hf_home:/root/.cache/huggingface")
for m in "${mounts[@]}"; do args+=(-v "$m"); done
args+=(-v "$name-compile-cache:$cache")
while IFS= read -r k; do
  args+=(-e "$k=${envs[$k]}")
done < <(printf '%s\n' "${!envs[@]}" | LC_ALL=C sort)
[[ -n $env_file ]] && args+=(--env-file "$env_file")
args+=("${extra[@]}")
args+=(--label "bootstrap.cluster=$cluster" --label "bootstrap.host=$(hostname)" --label "bootstrap.role=$role")
if [[ $no_ray == 1 ]]; then
  args+=(--entrypoint sleep "$image" infinity)
else
  args+=(--entrypoint ray "$image" start --block)
  if [[ $role == head ]]; then
    args+=(--head "--node-ip-address=$node_ip" "--port=$gcs_port" "--dashboard-port=$dash_port")
    [[ $dash_host == 127.0.0.1 ]] || args+=("--dashboard-host=$dash_host")
  else
    args+=("--address=$(hostport "$head_ip" "$gcs_port")" "--node-ip-address=$node_ip")
  fi
  [[ -z $num_gpus ]] || args+=("--num-gpus=$num_gpus")
  args+=("--metrics-export-port=$metrics_port" --disable-usage-stats)
fi

if [[ $dry_run == 1 ]]; then
  printf '%s\0' "${args[@]}"
  exit 0
fi

"${args[@]}" >/dev/null
echo "started $role container '$name' (VLLM_HOST_IP=$node_ip); check with: docker exec $name ray status" >&2
if [[ $foreground == 1 ]]; then
  trap 'docker rm -f "$name" >/dev/null' EXIT INT TERM
  docker logs -f "$name"
fi
