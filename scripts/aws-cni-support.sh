#!/bin/sh
# aws-cni-support.sh: the node-side support collector of aws-vpc-cni-rs.
#
# Installed by the aws-node init container as /opt/cni/bin/aws-cni-support.sh, the name and
# place upstream's init image gives its collector. Run it as root on the node (the host's
# shell, nothing else needed); it gathers this CNI's logs, ipamd's introspection and metrics,
# the checkpoint, the kernel's routing and firewall state, the CNI configuration and the
# relevant sysctls into one archive, prints the archive's path on stdout (progress goes to
# stderr) and exits 0, also when some tool or file is missing: what could not be collected is
# listed in missing.txt inside the archive.
#
# It only reads: no link, address, route, rule, firewall or sysctl is changed, no signal is
# sent, nothing is written outside a temporary directory (removed at exit) and the archive.
#
# Archive: <output dir>/eks_<instance id>_<UTC %Y-%m-%d_%H%M-%Z>_<collector version>.tar.gz,
# output dir /var/log, with upstream's top-level folders (ipamd/, networking/, var_log/,
# sysctls/, cni/, kernel/, system/, kubelet/, containerd/). docs/ipamd.md, "Support archive".
#
# Options (upstream's): --ignore_introspection=true|false, --ignore_metrics=true|false, --help.
# Environment overrides (defaults are the node's real paths and ipamd's default ports; tests
# point them at a simulated node's files):
#   AWS_CNI_SUPPORT_LOG_DIR            /var/log/aws-routed-eni   ipamd and plugin logs
#   AWS_CNI_SUPPORT_CHECKPOINT         /var/run/aws-node/ipam.json (and its .cooldown side file)
#   AWS_CNI_SUPPORT_CNI_CONF_DIR       /etc/cni/net.d
#   AWS_CNI_SUPPORT_CNI_BIN_DIR        /opt/cni/bin              listed, not copied
#   AWS_CNI_SUPPORT_OUTPUT_DIR         /var/log                  where the archive is written
#   AWS_CNI_SUPPORT_INTROSPECTION_ADDR 127.0.0.1:61679
#   AWS_CNI_SUPPORT_METRICS_ADDR       127.0.0.1:61678
#   AWS_CNI_SUPPORT_IMDS_ENDPOINT      http://169.254.169.254
#   AWS_CNI_SUPPORT_INSTANCE_ID_FILE   /var/lib/cloud/data/instance-id (IMDS when absent)
set -u

# The collector's own version: the last part of the archive name. Bump it when the layout
# of the archive changes.
COLLECTOR_VERSION=rs1

log_dir=${AWS_CNI_SUPPORT_LOG_DIR:-/var/log/aws-routed-eni}
checkpoint=${AWS_CNI_SUPPORT_CHECKPOINT:-/var/run/aws-node/ipam.json}
cni_conf_dir=${AWS_CNI_SUPPORT_CNI_CONF_DIR:-/etc/cni/net.d}
cni_bin_dir=${AWS_CNI_SUPPORT_CNI_BIN_DIR:-/opt/cni/bin}
output_dir=${AWS_CNI_SUPPORT_OUTPUT_DIR:-/var/log}
introspection_addr=${AWS_CNI_SUPPORT_INTROSPECTION_ADDR:-127.0.0.1:61679}
metrics_addr=${AWS_CNI_SUPPORT_METRICS_ADDR:-127.0.0.1:61678}
imds=${AWS_CNI_SUPPORT_IMDS_ENDPOINT:-http://169.254.169.254}
instance_id_file=${AWS_CNI_SUPPORT_INSTANCE_ID_FILE:-/var/lib/cloud/data/instance-id}

ignore_introspection=false
ignore_metrics=false

usage() {
    cat <<EOF
usage: $0 [--ignore_introspection=true|false] [--ignore_metrics=true|false] [--help]

Collects this node's VPC CNI logs and state into
$output_dir/eks_<instance id>_<date>_$COLLECTOR_VERSION.tar.gz and prints its path.
  --ignore_introspection=true  skip ipamd's introspection (DISABLE_INTROSPECTION=true)
  --ignore_metrics=true        skip ipamd's metrics (DISABLE_METRICS=true)
EOF
}

say() { printf 'aws-cni-support: %s\n' "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

for arg in "$@"; do
    case $arg in
        --ignore_introspection=true | --ignore_introspection=false) ignore_introspection=${arg#*=} ;;
        --ignore_metrics=true | --ignore_metrics=false) ignore_metrics=${arg#*=} ;;
        --help | -h)
            usage
            exit 0
            ;;
        *)
            say "unknown option: $arg"
            usage >&2
            exit 1
            ;;
    esac
done

[ "$(id -u 2>/dev/null)" = 0 ] || die "must run as root (the firewall and the checkpoint are root's)"
have tar || die "tar not found: cannot write the archive"

mkdir -p "$output_dir" || die "cannot create $output_dir"
if have df; then
    # As upstream: refuse when less than 1.5 GB are free where the archive goes.
    free_kb=$(df -P -k "$output_dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
    case $free_kb in
        '' | *[!0-9]*) ;;
        *) [ "$free_kb" -gt 1500000 ] || die "less than 1.5 GB free in $output_dir" ;;
    esac
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/aws-cni-support.XXXXXX" 2>/dev/null) || work=
if [ -z "$work" ]; then
    work=${TMPDIR:-/tmp}/aws-cni-support.$$
    mkdir -m 700 "$work" || die "cannot create a temporary directory"
fi
tmp_archive=$output_dir/.aws-cni-support.$$.tar.gz
cleanup() {
    rm -f "$tmp_archive"
    [ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for d in ipamd networking var_log sysctls cni kernel system kubelet containerd; do
    mkdir -p "$work/$d" || die "cannot create $work/$d"
done
: >"$work/missing.txt"
: >"$work/errors.txt"

# Records what could not be collected (missing tool, missing file, failed command).
missing() { printf '%s\n' "$*" >>"$work/missing.txt"; }

# run OUT TOOL [ARG...]: TOOL's stdout into OUT (relative to the archive), its stderr into
# errors.txt, bounded by `timeout 75` when available (as upstream). Never fails.
run() {
    run_out=$work/$1
    shift
    if ! have "$1"; then
        missing "tool $1: not found ($*)"
        return 0
    fi
    if have timeout; then
        timeout 75 "$@" >"$run_out" 2>"$work/.stderr"
    else
        "$@" >"$run_out" 2>"$work/.stderr"
    fi
    run_rc=$?
    if [ -s "$work/.stderr" ]; then
        {
            printf '== %s (exit %s)\n' "$*" "$run_rc"
            cat "$work/.stderr"
        } >>"$work/errors.txt"
    fi
    rm -f "$work/.stderr"
    [ "$run_rc" -eq 0 ] || missing "command failed (exit $run_rc): $*"
    return 0
}

# copy SRC DEST: a file or directory (symbolic links followed), or a line in missing.txt.
copy() {
    if [ -e "$1" ]; then
        cp -R -L "$1" "$work/$2" 2>>"$work/errors.txt" || missing "copy failed: $1"
    else
        missing "file $1: not present"
    fi
}

# http_get URL OUT: curl, else wget; 3 s as upstream. Returns the client's status. An error
# answer is kept as it came, as upstream's collector keeps it (/v1/eni-configs answers 404
# while ipamd has not read its Node).
http_get() {
    if have curl; then
        curl --silent --show-error --max-time 3 --output "$2" "$1" 2>>"$work/errors.txt"
    elif have wget; then
        wget -q -T 3 -O "$2" "$1" 2>>"$work/errors.txt"
    else
        return 127
    fi
}

# imds PATH: one IMDSv2 read (curl only), printed; empty on failure.
imds_token=
imds() {
    have curl || return 0
    if [ -z "$imds_token" ]; then
        imds_token=$(curl --silent --fail --max-time 3 --request PUT \
            --header 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/latest/api/token" 2>/dev/null) || imds_token=
    fi
    curl --silent --fail --max-time 3 --header "X-aws-ec2-metadata-token: $imds_token" \
        "$imds/latest/meta-data/$1" 2>/dev/null
}

say "collecting into $work"
{
    printf 'collector: aws-cni-support.sh %s (aws-vpc-cni-rs)\n' "$COLLECTOR_VERSION"
    printf 'ignore_introspection: %s\nignore_metrics: %s\n' "$ignore_introspection" "$ignore_metrics"
    printf 'log dir: %s\ncheckpoint: %s\ncni conf dir: %s\ncni bin dir: %s\n' \
        "$log_dir" "$checkpoint" "$cni_conf_dir" "$cni_bin_dir"
    printf 'introspection: %s\nmetrics: %s\nimds: %s\n' "$introspection_addr" "$metrics_addr" "$imds"
} >"$work/system/script-params.txt"

# --- instance (the archive's name) -------------------------------------------------------
instance_id=
if [ -r "$instance_id_file" ] && grep -q '^i-' "$instance_id_file" 2>/dev/null; then
    instance_id=$(head -n 1 "$instance_id_file")
else
    instance_id=$(imds instance-id)
fi
case $instance_id in
    '' | *[!A-Za-z0-9-]*)
        missing "instance id: neither $instance_id_file nor IMDS ($imds) answered"
        instance_id=
        ;;
    *) printf '%s\n' "$instance_id" >"$work/system/instance-id.txt" ;;
esac
region=$(imds placement/region)
[ -n "$region" ] && printf '%s\n' "$region" >"$work/system/region.txt"
az=$(imds placement/availability-zone)
[ -n "$az" ] && printf '%s\n' "$az" >"$work/system/availability-zone.txt"

# --- logs -------------------------------------------------------------------------------
say "logs"
copy "$log_dir" var_log/aws-routed-eni
for f in /var/log/containers/aws-node* /var/log/pods/kube-system_aws-node* \
    /var/log/containers/kube-system_cni-metrics-helper* /var/log/pods/kube-system_cni-metrics-helper*; do
    [ -e "$f" ] && cp -R -L "$f" "$work/var_log/" 2>>"$work/errors.txt"
done

# --- ipamd: introspection, metrics, checkpoint --------------------------------------------
say "ipamd"
if ! have curl && ! have wget; then
    missing "tool curl or wget: not found (introspection and metrics)"
else
    if [ "$ignore_introspection" = false ]; then
        for ep in enis eni-configs networkutils-env-settings ipamd-env-settings; do
            if ! http_get "http://$introspection_addr/v1/$ep" "$work/ipamd/$ep.json"; then
                rm -f "$work/ipamd/$ep.json"
                missing "introspection http://$introspection_addr/v1/$ep: no answer"
            fi
        done
    else
        echo "introspection skipped (--ignore_introspection=true)" >"$work/ipamd/ipam_introspection_ignore.txt"
    fi
    if [ "$ignore_metrics" = false ]; then
        # upstream's file name, although the content is Prometheus text
        if ! http_get "http://$metrics_addr/metrics" "$work/ipamd/metrics.json"; then
            rm -f "$work/ipamd/metrics.json"
            missing "metrics http://$metrics_addr/metrics: no answer"
        fi
    else
        echo "metrics skipped (--ignore_metrics=true)" >"$work/ipamd/ipam_metrics_ignore.txt"
    fi
fi
copy "$checkpoint" ipamd/ipam.json
copy "$checkpoint.cooldown" ipamd/ipam.json.cooldown

# --- networking ---------------------------------------------------------------------------
say "networking"
run networking/iprule.txt ip rule show
run networking/iprule6.txt ip -6 rule show
run networking/iproute.txt ip route show table all
run networking/iproute6.txt ip -6 route show table all
run networking/iplink.txt ip -d link show
run networking/ipaddr.txt ip addr show
run networking/ipneigh.txt ip neigh show
# -save only: listing a table with `iptables -L` may create it (legacy module autoload).
for t in iptables-save ip6tables-save iptables-legacy-save ip6tables-legacy-save \
    iptables-nft-save ip6tables-nft-save; do
    run "networking/$t.txt" "$t" -c
done
run networking/nft-ruleset.txt nft list ruleset
run networking/conntrack-stats.txt conntrack -S
run networking/conntrack.txt conntrack -L
copy /etc/resolv.conf networking/resolv.conf

# --- sysctls --------------------------------------------------------------------------------
say "sysctls"
run sysctls/sysctl_all.txt sysctl -a
# The ones this CNI and its init set or depend on, read from /proc/sys (no procps needed).
for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/tcp_early_demux \
    /proc/sys/net/ipv4/ip_local_port_range /proc/sys/net/ipv4/conf/*/rp_filter \
    /proc/sys/net/ipv4/conf/*/forwarding /proc/sys/net/ipv6/conf/*/forwarding \
    /proc/sys/net/ipv6/conf/*/accept_ra /proc/sys/net/ipv6/conf/*/disable_ipv6 \
    /proc/sys/net/ipv4/neigh/default/gc_thresh1 /proc/sys/net/ipv4/neigh/default/gc_thresh2 \
    /proc/sys/net/ipv4/neigh/default/gc_thresh3 /proc/sys/net/netfilter/nf_conntrack_max \
    /proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal; do
    [ -r "$f" ] || continue
    key=$(printf '%s' "${f#/proc/sys/}" | tr / .)
    printf '%s = %s\n' "$key" "$(cat "$f" 2>/dev/null)"
done >"$work/sysctls/cni-sysctls.txt"

# --- CNI configuration ------------------------------------------------------------------------
say "CNI configuration"
if [ -d "$cni_conf_dir" ]; then
    cp -R -L "$cni_conf_dir/." "$work/cni/" 2>>"$work/errors.txt" || missing "copy failed: $cni_conf_dir"
else
    missing "file $cni_conf_dir: not present"
fi
if [ -d "$cni_bin_dir" ]; then
    ls -l "$cni_bin_dir" >"$work/cni/bin-listing.txt" 2>>"$work/errors.txt"
else
    missing "file $cni_bin_dir: not present"
fi

# --- kernel, system ---------------------------------------------------------------------------
say "kernel and system"
run kernel/uname.txt uname -a
run kernel/dmesg.current dmesg
run system/ps.txt ps auxww
run system/df.txt df -h
copy /proc/mounts system/mounts.txt

# --- kubelet and containerd -----------------------------------------------------------------
say "kubelet and containerd"
if [ -d /run/systemd/system ]; then
    run kubelet/kubelet.log journalctl --no-pager --unit=kubelet --since '10 days ago'
    run kubelet/kubelet_service.txt systemctl cat kubelet
    run containerd/containerd-log.txt journalctl --no-pager --unit=containerd --since '10 days ago'
else
    missing "systemd: not running (kubelet and containerd journals)"
fi
[ -d /etc/kubernetes/kubelet ] && cp -R -L /etc/kubernetes/kubelet "$work/kubelet/config" 2>>"$work/errors.txt"
run containerd/containerd-config.txt containerd config dump
if [ -S /run/containerd/containerd.sock ]; then
    run containerd/containerd-version.txt ctr version
    run containerd/containerd-containers.txt ctr --namespace k8s.io containers list
else
    missing "file /run/containerd/containerd.sock: not present (ctr not asked)"
fi

# --- archive -----------------------------------------------------------------------------------
now=$(date -u +%Y-%m-%d_%H%M-%Z)
archive=$output_dir/eks_${instance_id}_${now}_${COLLECTOR_VERSION}.tar.gz
say "writing $archive"
if ! tar -czf "$tmp_archive" -C "$work" . 2>>"$work/errors.txt"; then
    rm -f "$tmp_archive"
    cat "$work/errors.txt" >&2
    die "tar failed"
fi
mv -f "$tmp_archive" "$archive" || die "cannot move the archive to $archive"
if [ -s "$work/missing.txt" ]; then
    say "not collected ($(wc -l <"$work/missing.txt") items, see missing.txt in the archive)"
fi
printf '%s\n' "$archive"
