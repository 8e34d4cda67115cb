# keepalived's container on a router host (bootstrap fleet with cluster.router.vip).
# sh vip_entry.sh VIP PORT IP SECRET CONF RUN
#   VIP:PORT is forwarded to IP:PORT (the router listens on the host's data-plane IP only), both for
#   what arrives (PREROUTING) and for what the host itself sends (OUTPUT); keepalived then holds VIP
#   while it is master. SECRET (a variable name, may be empty) holds VRRP's password. On SIGTERM
#   keepalived gives the address up and the forwarding is removed.
vip=$1 port=$2 ip=$3 secret=$4 conf=$5 run=$6
for tool in keepalived iptables curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "bootstrap: $tool is not in this image (cluster.router.vip.image)" >&2; exit 78; }
done
rule="-d $vip/32 -p tcp --dport $port -m comment --comment bootstrap-vip -j DNAT --to-destination $ip:$port"
forward() {  # $1: -I (add unless there) or -D (remove while there)
  for chain in PREROUTING OUTPUT; do
    if iptables -w 5 -t nat -C "$chain" $rule 2>/dev/null; then
      [ "$1" = -D ] && iptables -w 5 -t nat -D "$chain" $rule
    elif [ "$1" = -I ]; then
      iptables -w 5 -t nat -I "$chain" $rule || return 1
    fi
  done
  return 0
}
forward -I || { echo "bootstrap: cannot forward $vip:$port to $ip:$port (iptables -t nat)" >&2; exit 1; }
if [ -n "$secret" ]; then
  eval "pass=\${$secret:-}"
  [ -n "$pass" ] || { echo "bootstrap: the secret $secret is not on this host: run bootstrap up" >&2; exit 78; }
  (umask 077; printf 'authentication {\n    auth_type PASS\n    auth_pass %s\n}\n' "$pass" > "$run/auth.conf")
  unset pass
fi
keepalived --dont-fork --log-console --log-detail --vrrp -f "$conf" \
  -p "$run/keepalived.pid" -r "$run/vrrp.pid" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
wait $child
rc=$?
if kill -0 $child 2>/dev/null; then wait $child; rc=$?; fi
forward -D
echo "bootstrap: keepalived stopped (exit $rc); forwarding of $vip:$port removed"
exit $rc
