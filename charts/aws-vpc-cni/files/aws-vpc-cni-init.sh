#!/bin/sh
# The aws-vpc-cni-init container: what upstream's aws-vpc-cni-init does (its
# cmd/aws-vpc-cni-init/main.go), as one file in the image at /app/aws-vpc-cni-init.sh. The
# chart's init container runs it by name; the image's `init` target runs it as its default
# command, so upstream's manifests (no `command`) work with our init image (docs/image.md).
#
# Installs the CNI binaries on the host, atomically (copy + rename): aws-cni, egress-cni
# (chained after aws-cni), and every Linux reference plugin of containernetworking-plugins, as
# upstream's init installs every binary of its image: host-local (egress-cni's IPAM), those the
# conflist may chain (portmap always; bandwidth with ENABLE_BANDWIDTH_PLUGIN, tuning with
# DISABLE_POD_V6), loopback for the runtime, and the rest for chains of the cluster's own
# (Multus and other meta plugins). All are installed whatever the settings. Beside them the support collector, where upstream's
# init puts its own: /opt/cni/bin/aws-cni-support.sh (docs/ipamd.md, "Support archive").
# Then the sysctls (host netns: the pod is hostNetwork), including rp_filter=2 on the primary
# interface: this container is privileged, the aws-node container is not (NET_ADMIN and NET_RAW
# only: its /proc/sys is read-only), so every kernel setting is made here and ipamd only reads
# them (docs/host-networking.md, "Privileges").
set -eu

# The host's CNI bin dir: HOST_CNI_BIN_PATH, as upstream's init reads it.
bin="${HOST_CNI_BIN_PATH:-/host/opt/cni/bin}"
for b in aws-cni egress-cni dhcp host-local static bridge host-device ipvlan loopback macvlan ptp vlan bandwidth firewall portmap sbr tuning vrf aws-cni-support.sh; do
  cp "/app/$b" "$bin/.$b.tmp"
  mv "$bin/.$b.tmp" "$bin/$b"
done
# Booleans as upstream's GetBoolAsStringEnvVar reads them (strconv.ParseBool): unset gives the
# default; a value that is not a Go boolean gives the default and upstream's error line.
parse_bool() {
  is_set="" val=""
  eval "is_set=\${$1+set} val=\${$1-}"
  if [ -z "$is_set" ]; then echo "$2"; return 0; fi
  case "$val" in
    1|t|T|TRUE|true|True) echo true ;;
    0|f|F|FALSE|false|False) echo false ;;
    *) echo "aws-vpc-cni-init: Failed to parse variable $1 with value $val as boolean" >&2
       echo "$2" ;;
  esac
}
# The primary interface: the one of the IPv4 default route (upstream asks IMDS for its MAC).
primary=$(awk '$2 == "00000000" { print $1; exit }' /proc/net/route)
# Loose reverse-path filtering on it, always, as upstream's init: replies to pods on secondary
# ENIs whose connections were SNATed to the primary IP arrive here while their source routes
# out of another ENI's table; strict filtering (1) drops them. ipamd checks it at start.
if [ -n "$primary" ]; then
  echo 2 > "/proc/sys/net/ipv4/conf/$primary/rp_filter"
else
  echo "aws-vpc-cni-init: no IPv4 default route: rp_filter left as it is" >&2
fi
# DISABLE_TCP_EARLY_DEMUX=true: kubelet's TCP probes to pods behind branch ENIs (#1212).
# Skipped on kernels without the knob.
if [ -e /proc/sys/net/ipv4/tcp_early_demux ]; then
  if [ "$(parse_bool DISABLE_TCP_EARLY_DEMUX false)" = true ]; then demux=0; else demux=1; fi
  echo "$demux" > /proc/sys/net/ipv4/tcp_early_demux
fi
# IPv6 as upstream's init: ENABLE_IPv6=true turns IPv6 on (never off otherwise); ENABLE_IPv6 or
# ENABLE_V6_EGRESS (egress-cni's v6if0 traffic is routed by the node): forwarding on, and
# accept_ra=2 on the primary interface so the node keeps its RA default route while
# forwarding. With IPv6 on, also `default` (ours, explicit; the kernel already copies `all`
# there): secondary ENIs attached later inherit it, and ipamd, which may not write it, only
# checks it on each ENI it sets up.
v6=false; v6_routed=false
if [ "$(parse_bool ENABLE_IPv6 false)" = true ]; then v6=true; v6_routed=true; fi
if [ "$(parse_bool ENABLE_V6_EGRESS false)" = true ]; then v6_routed=true; fi
# ours: dual-stack pods need the node's IPv6 as an IPv6 cluster does
if [ "$(parse_bool ENABLE_DUAL_STACK_PODS false)" = true ]; then v6=true; v6_routed=true; fi
if [ "$v6" = true ]; then
  echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6
  echo 0 > /proc/sys/net/ipv6/conf/default/disable_ipv6
fi
if [ "$v6_routed" = true ]; then
  echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
  if [ -n "$primary" ]; then
    echo 2 > "/proc/sys/net/ipv6/conf/$primary/accept_ra"
  else
    echo "aws-vpc-cni-init: no IPv4 default route: accept_ra left as it is" >&2
  fi
fi
