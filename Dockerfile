# Image for the aws-node DaemonSet: ipamd, the aws-cni plugin, egress-cni (other-family pod
# egress, chained after aws-cni), aws-cni-conflist (fills in the conflist at start-up), the health
# probe, and every Linux reference plugin of containernetworking-plugins, as upstream's init image
# carries them (the conflist chains portmap, host-local for egress-cni's IPAM, the optional
# bandwidth and tuning; the runtime needs loopback; chains such as Multus set-ups use the
# others; charts/aws-vpc-cni installs them all). Everything the init container puts on the
# node is fully static (no ELF interpreter, no NEEDED library), so any node's glibc will do
# (Amazon Linux 2: 2.26, Ubuntu 20.04: 2.31): aws-cni and egress-cni from
# scripts/build-static-plugins.sh, the reference plugins containernetworking-plugins v1.1.1 built
# with CGO_ENABLED=0 from Debian bookworm's source package by scripts/build-reference-plugins.sh
# (not Debian's binary package: dynamically linked, it needs GLIBC_2.34; docs/image.md).
#
# Users build from source: `podman build -t aws-vpc-cni-rs .` (BINARIES=source, the default);
# the init image (upstream's separate amazon-k8s-cni-init): `--target init` (docs/image.md).
# The same file builds the cni-metrics-helper image (charts/cni-metrics-helper), which upstream
# ships as a separate image: `podman build --target cni-metrics-helper -t cni-metrics-helper-rs .`
# The image test (integration/tests/image.rs) passes `--build-arg BINARIES=prebuilt` and a
# context holding the already-built binaries under prebuilt/, so the workspace is not compiled a
# second time; buildah skips the unused stage, so rust:1.95-bookworm is then never needed.
ARG BINARIES=source

FROM rust:1.95-bookworm AS bins-source
# Debian's Go and the reference plugins' Go sources (GOPATH mode; the script fetches the plugins'
# main packages with `apt-get source` and checks that the result is static); protoc for the
# workspace's test crate (its CRI client compiles cri-api's api.proto).
RUN apt-get update \
 && apt-get install -y --no-install-recommends golang-go golang-github-containernetworking-plugins-dev \
    golang-github-mattn-go-shellwords-dev golang-github-networkplumbing-go-nft-dev golang-dbus-dev \
    golang-github-d2g-dhcp4-dev golang-github-d2g-dhcp4client-dev \
    golang-github-coreos-go-systemd-dev dpkg-dev binutils protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# ipamd is static as well (scripts/build-static-ipamd.sh: no shared libraries mapped, ~2 MiB
# less resident; docs/performance.md "Round 5"); the other in-image binaries stay dynamic on the
# image's glibc.
RUN cargo build --release --locked --workspace --bin aws-cni-conflist --bin grpc-health-probe \
      --bin cni-metrics-helper \
 && scripts/build-static-plugins.sh --release --locked \
 && scripts/build-static-ipamd.sh --release --locked \
 && scripts/build-reference-plugins.sh /tmp/reference-plugins \
 && mkdir -p /out/reference \
 && cp /tmp/reference-plugins/* /out/reference/ \
 && cp "target/$(rustc -vV | sed -n 's/^host: //p')/release/aws-cni" \
       "target/$(rustc -vV | sed -n 's/^host: //p')/release/egress-cni" \
       "target/$(rustc -vV | sed -n 's/^host: //p')/release/ipamd" /out/ \
 && cp target/release/aws-cni-conflist \
       target/release/grpc-health-probe target/release/cni-metrics-helper /out/

FROM scratch AS bins-prebuilt
COPY prebuilt/aws-cni prebuilt/egress-cni prebuilt/aws-cni-conflist prebuilt/grpc-health-probe \
     prebuilt/ipamd prebuilt/cni-metrics-helper /out/
COPY prebuilt/reference/ /out/reference/

FROM bins-${BINARIES} AS bins

# cni-metrics-helper: one binary; CA roots for the CloudWatch and API-server TLS clients.
FROM debian:bookworm-slim AS cni-metrics-helper
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=bins /out/cni-metrics-helper /app/cni-metrics-helper
ENTRYPOINT ["/app/cni-metrics-helper"]

# aws-node (the default target: the last stage, `FROM aws-node` at the end). Started with no
# command, as upstream's manifests start upstream's image (whose ENTRYPOINT is /app/aws-vpc-cni,
# WORKDIR /app), it runs the aws-node start-up, /app/aws-node.sh. It also carries the init script,
# so the chart's default (one image for both containers) works.
FROM debian:bookworm-slim AS aws-node
WORKDIR /app
# ipamd's host networking needs iptables (both the legacy and the nft backends:
# iptables-{legacy,nft}-{save,restore}), nft (the native connmark table `ip aws-cni` on
# nf_tables nodes), iproute2 and sysctl (procps).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables iproute2 procps ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=bins /out/aws-cni /out/egress-cni /out/aws-cni-conflist /out/grpc-health-probe \
     /out/ipamd /app/
# The static reference plugins (containernetworking-plugins v1.1.1), for the init container.
COPY --from=bins /out/reference/ /app/
# The support collector the init container installs beside the plugins, as upstream's init image
# does (/opt/cni/bin/aws-cni-support.sh; executable in the repository).
COPY scripts/aws-cni-support.sh /app/aws-cni-support.sh
# The start-up and init scripts and the default conflist template (upstream's image bakes its
# misc/10-aws.conflist in /app too): the chart's files, which the chart runs and mounts by these
# names (executable in the repository).
COPY charts/aws-vpc-cni/files/aws-node.sh charts/aws-vpc-cni/files/aws-vpc-cni-init.sh \
     charts/aws-vpc-cni/files/10-aws.conflist /app/
ENTRYPOINT ["/app/aws-node.sh"]

# The init image (upstream ships it separately, amazon-k8s-cni-init): only what the init script
# installs, and the script as the default command (upstream's init image: CMD
# ["/init/aws-vpc-cni-init"]; ours keeps the aws-node image's /app layout, so the chart's
# `command` works with either image). `podman build --target init -t aws-vpc-cni-rs-init .`
FROM debian:bookworm-slim AS init
WORKDIR /app
COPY --from=bins /out/reference/ /app/
COPY --from=aws-node /app/aws-cni /app/egress-cni /app/aws-cni-support.sh \
     /app/aws-vpc-cni-init.sh /app/
CMD ["/app/aws-vpc-cni-init.sh"]

# The default target: the aws-node image.
FROM aws-node
