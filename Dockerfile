# Image for the aws-node DaemonSet: ipamd, the aws-cni plugin and the health probe.
# (No Docker engine exists on the development machines of this project; this file is kept
# buildable by review, and CI builds the same binaries with cargo.)

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p aws-cni -p ipamd \
 && mkdir -p /out \
 && cp target/release/aws-cni target/release/ipamd /out/ \
 && (cp target/release/grpc-health-probe /out/ 2>/dev/null || true)

FROM debian:bookworm-slim
# ipamd's host networking needs iptables (both the legacy and the nft backends:
# iptables-{legacy,nft}-{save,restore}), iproute2 and sysctl (procps).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables iproute2 procps ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=build /out/ /app/
ENTRYPOINT ["/app/ipamd"]
