"""The network as each node sees it, read over a Session: check-nccl's look, and doctor's.

The node container's addresses and *_SOCKET_IFNAME settings beside the host's interfaces; the pure
rules over it are signatures/rules.network_findings.

It lives in nccl/, the lower of its two users (doctor imports nccl, never the other way), rather than
in cluster/probe.py: the NodeNet it fills and the `ip addr` parser (D.parse_ip_addr) are in
bootstrap/signatures, above the cluster layer, which never imports them."""
from __future__ import annotations

from bootstrap import signatures as D
from bootstrap.model import Host
from bootstrap.remote import docker as DK
from bootstrap.remote.session import Session
from bootstrap.signatures import rules as DR

IP_ADDR = ("ip", "-o", "addr", "show")


def node_net(sess: Session, h: Host) -> DR.NodeNet:
    s = sess.ssh[h.name]
    st = DK.inspect(s, sess.inv.cluster.container_name)
    env = st.env if st else {}
    # not checked: no interfaces read means the interface rules skip this host (check_cluster), never
    # that they report an interface missing
    ifs = s.run(IP_ADDR, timeout=30, check=False)
    socket_env = tuple(sorted((k, v) for k, v in (env or dict(h.env)).items() if k.endswith("_SOCKET_IFNAME")))
    return DR.NodeNet(h.name, h.ip, st.status if st else "absent", env.get("VLLM_HOST_IP"),
                      DR.ray_ip_from_args(st.args if st else ()), D.parse_ip_addr(ifs.stdout) if ifs.ok else (),
                      socket_env)
